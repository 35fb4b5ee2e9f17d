//! EventBridge Scheduler's schedule expressions, exactly as it takes them
//! (docs.aws.amazon.com/scheduler/latest/UserGuide/schedule-types.html):
//!
//! - `cron(minutes hours day-of-month month day-of-week year)`: `,` lists,
//!   `-` ranges, `/` steps, `*` any; `?` in exactly one of the two day
//!   fields; `L` (the last day of the month, or with a day of the week its
//!   last such day in the month), `W` (the weekday nearest a day of the
//!   month, `LW` the month's last weekday), `#` (`2#1`: the first Monday);
//!   months `1-12` or `JAN-DEC`, days of the week `1-7` or `SUN-SAT`
//!   (Sunday is 1), years 1970-2199.
//! - `rate(1 minute)`, `rate(5 minutes)`, `hour(s)`, `day(s)`: the unit
//!   singular exactly when the value is 1.
//! - `at(yyyy-mm-ddThh:mm:ss)`: once.
//!
//! Times are the schedule's time zone's wall-clock times. Across daylight
//! saving, as EventBridge does: a local time that does not exist is
//! skipped, one that happens twice fires once (the first).

use chrono::{
    DateTime, Datelike, Duration, LocalResult, NaiveDate, NaiveDateTime, TimeZone, Utc, Weekday,
};
use chrono_tz::Tz;

/// A schedule expression that is not one EventBridge Scheduler takes:
/// what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ExprError(pub String);

fn bad<T>(why: impl Into<String>) -> Result<T, ExprError> {
    Err(ExprError(why.into()))
}

/// A parsed schedule expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expression {
    Cron(Cron),
    /// Every `every_s` seconds from the schedule's start.
    Rate {
        every_s: i64,
    },
    /// Once, at this wall-clock time.
    At(NaiveDateTime),
}

/// A cron expression's fields, each a sorted set of the values it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    minutes: Vec<u32>,
    hours: Vec<u32>,
    days: Days,
    months: Vec<u32>,
    /// `None`: every year.
    years: Option<Vec<u32>>,
}

/// Which days a cron expression fires on: one day field is `?`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Days {
    OfMonth(DayOfMonth),
    OfWeek(DayOfWeek),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum DayOfMonth {
    /// These days (sorted; `*` is 1-31).
    Days(Vec<u32>),
    /// `L`.
    Last,
    /// `LW`.
    LastWeekday,
    /// `15W`: the weekday nearest the 15th, within the month.
    NearestWeekday(u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum DayOfWeek {
    /// These days of the week, 1 (Sunday) to 7 (Saturday).
    Days(Vec<u32>),
    /// `2#1`: the `n`-th such day of the month.
    Nth { day: u32, n: u32 },
    /// `6L`: the month's last such day.
    Last { day: u32 },
}

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// The last year EventBridge takes.
const LAST_YEAR: u32 = 2199;

impl Expression {
    pub fn parse(text: &str) -> Result<Expression, ExprError> {
        let text = text.trim();
        let inner = |prefix: &str| {
            text.strip_prefix(prefix)
                .and_then(|rest| rest.strip_suffix(')'))
                .map(str::trim)
        };
        if let Some(body) = inner("cron(") {
            return Cron::parse(body).map(Expression::Cron);
        }
        if let Some(body) = inner("rate(") {
            return parse_rate(body);
        }
        if let Some(body) = inner("at(") {
            return NaiveDateTime::parse_from_str(body, "%Y-%m-%dT%H:%M:%S")
                .map(Expression::At)
                .or_else(|_| bad(format!("at({body}): the time must be yyyy-mm-ddThh:mm:ss")));
        }
        bad("must be cron(...), rate(...) or at(...)")
    }

    /// The first firing strictly after `after`, in the time zone `tz`;
    /// `anchor` is when a rate schedule starts counting (its start, or
    /// its creation). `None`: it never fires again.
    pub fn next_after(
        &self,
        tz: Tz,
        after: DateTime<Utc>,
        anchor: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        match self {
            Expression::Cron(c) => c.next_after(tz, after),
            Expression::Rate { every_s } => {
                let period = Duration::seconds(*every_s);
                if after < anchor {
                    return Some(anchor + period);
                }
                let elapsed = (after - anchor).num_seconds();
                let k = elapsed / every_s + 1;
                Some(anchor + period * i32::try_from(k).ok()?)
            }
            Expression::At(local) => {
                let at = first_instant(tz, local)?;
                (at > after).then_some(at)
            }
        }
    }

    /// The next `n` firings after `after`.
    pub fn next_n(
        &self,
        tz: Tz,
        after: DateTime<Utc>,
        anchor: DateTime<Utc>,
        n: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut out = Vec::with_capacity(n);
        let mut from = after;
        while out.len() < n {
            let Some(next) = self.next_after(tz, from, anchor) else {
                break;
            };
            out.push(next);
            from = next;
        }
        out
    }
}

/// The instant a wall-clock time is in `tz`: the first of two when it
/// happens twice, none when it does not happen.
fn first_instant(tz: Tz, local: &NaiveDateTime) -> Option<DateTime<Utc>> {
    match tz.from_local_datetime(local) {
        LocalResult::Single(t) => Some(t.with_timezone(&Utc)),
        LocalResult::Ambiguous(first, _) => Some(first.with_timezone(&Utc)),
        LocalResult::None => None,
    }
}

fn parse_rate(body: &str) -> Result<Expression, ExprError> {
    let wrong = || {
        bad(format!(
            "rate({body}): must be a positive whole number and minute(s), hour(s) or day(s), \
             singular only for 1"
        ))
    };
    let mut words = body.split_whitespace();
    let (Some(value), Some(unit), None) = (words.next(), words.next(), words.next()) else {
        return wrong();
    };
    let Ok(value) = value.parse::<i64>() else {
        return wrong();
    };
    let unit_s = match (value, unit) {
        (1, "minute") => 60,
        (1, "hour") => 3600,
        (1, "day") => 86_400,
        (2.., "minutes") => 60,
        (2.., "hours") => 3600,
        (2.., "days") => 86_400,
        _ => return wrong(),
    };
    match value.checked_mul(unit_s) {
        Some(every_s) if every_s <= 10 * 366 * 86_400 => Ok(Expression::Rate { every_s }),
        _ => wrong(),
    }
}

/// One cron field: `*`, a list of values, ranges and steps, with names.
fn field(
    text: &str,
    name: &str,
    min: u32,
    max: u32,
    names: &[&str],
) -> Result<Vec<u32>, ExprError> {
    let value = |s: &str| -> Result<u32, ExprError> {
        let upper = s.to_ascii_uppercase();
        if let Some(i) = names.iter().position(|n| *n == upper) {
            return Ok(min + i as u32);
        }
        match s.parse::<u32>() {
            Ok(v) if (min..=max).contains(&v) => Ok(v),
            _ => bad(format!("{name}: '{s}' is not between {min} and {max}")),
        }
    };
    let mut out = Vec::new();
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => match s.parse::<u32>() {
                Ok(step) if step > 0 => (r, step),
                _ => {
                    return bad(format!(
                        "{name}: the step in '{part}' must be a positive number"
                    ))
                }
            },
            None => (part, 1),
        };
        let (from, to) = match range {
            "*" => (min, max),
            r => match r.split_once('-') {
                Some((a, b)) => (value(a)?, value(b)?),
                // `5/10`: from 5 to the end, every 10.
                None if part.contains('/') => (value(r)?, max),
                None => {
                    let v = value(r)?;
                    (v, v)
                }
            },
        };
        if from > to {
            return bad(format!("{name}: the range '{range}' must go up"));
        }
        out.extend((from..=to).step_by(step as usize));
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

impl Cron {
    fn parse(body: &str) -> Result<Cron, ExprError> {
        let fields: Vec<&str> = body.split_whitespace().collect();
        let [minutes, hours, dom, month, dow, year] = fields[..] else {
            return bad(format!(
                "cron({body}): must have six fields: minutes hours day-of-month month day-of-week year"
            ));
        };
        let days = match (dom, dow) {
            ("?", "?") => return bad("day-of-month and day-of-week: exactly one must be '?'"),
            ("?", dow) => Days::OfWeek(parse_dow(dow)?),
            (dom, "?") => Days::OfMonth(parse_dom(dom)?),
            _ => return bad(
                "day-of-month and day-of-week: one of them must be '?' (they cannot both be given)",
            ),
        };
        Ok(Cron {
            minutes: field(minutes, "minutes", 0, 59, &[])?,
            hours: field(hours, "hours", 0, 23, &[])?,
            days,
            months: field(month, "month", 1, 12, &MONTHS)?,
            years: match year {
                "*" => None,
                y => Some(field(y, "year", 1970, LAST_YEAR, &[])?),
            },
        })
    }

    fn day_matches(&self, date: NaiveDate) -> bool {
        let last = last_day(date);
        match &self.days {
            Days::OfMonth(DayOfMonth::Days(days)) => days.contains(&date.day()),
            Days::OfMonth(DayOfMonth::Last) => date.day() == last,
            Days::OfMonth(DayOfMonth::LastWeekday) => {
                let mut d = last;
                while !is_weekday(date.with_day(d)) {
                    d -= 1;
                }
                date.day() == d
            }
            Days::OfMonth(DayOfMonth::NearestWeekday(target)) => {
                *target <= last && date.day() == nearest_weekday(date, *target, last)
            }
            Days::OfWeek(DayOfWeek::Days(days)) => {
                days.contains(&date.weekday().number_from_sunday())
            }
            Days::OfWeek(DayOfWeek::Nth { day, n }) => {
                date.weekday().number_from_sunday() == *day && (date.day() - 1) / 7 + 1 == *n
            }
            Days::OfWeek(DayOfWeek::Last { day }) => {
                date.weekday().number_from_sunday() == *day && date.day() + 7 > last
            }
        }
    }

    fn next_after(&self, tz: Tz, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut date = after.with_timezone(&tz).date_naive();
        loop {
            let year = u32::try_from(date.year()).ok()?;
            if year > LAST_YEAR {
                return None;
            }
            let year_ok = self.years.as_ref().is_none_or(|ys| ys.contains(&year));
            if year_ok && self.months.contains(&date.month()) && self.day_matches(date) {
                for h in &self.hours {
                    for m in &self.minutes {
                        let local = date.and_hms_opt(*h, *m, 0)?;
                        // A time that does not exist is skipped; one that
                        // happens twice fires at its first, once.
                        let Some(at) = first_instant(tz, &local) else {
                            continue;
                        };
                        if at > after {
                            return Some(at);
                        }
                    }
                }
            }
            date = date.succ_opt()?;
        }
    }
}

fn parse_dom(text: &str) -> Result<DayOfMonth, ExprError> {
    match text {
        "L" => return Ok(DayOfMonth::Last),
        "LW" => return Ok(DayOfMonth::LastWeekday),
        _ => {}
    }
    if let Some(day) = text.strip_suffix('W') {
        return match day.parse::<u32>() {
            Ok(d) if (1..=31).contains(&d) => Ok(DayOfMonth::NearestWeekday(d)),
            _ => bad(format!(
                "day-of-month: '{text}' must be a day 1-31 before W"
            )),
        };
    }
    field(text, "day-of-month", 1, 31, &[]).map(DayOfMonth::Days)
}

fn parse_dow(text: &str) -> Result<DayOfWeek, ExprError> {
    let day = |s: &str| field(s, "day-of-week", 1, 7, &WEEKDAYS).map(|v| v[0]);
    if text == "L" {
        return Ok(DayOfWeek::Days(vec![7]));
    }
    if let Some((d, n)) = text.split_once('#') {
        return match n.parse::<u32>() {
            Ok(n) if (1..=5).contains(&n) => Ok(DayOfWeek::Nth { day: day(d)?, n }),
            _ => bad(format!("day-of-week: in '{text}' the week must be 1-5")),
        };
    }
    if let Some(d) = text.strip_suffix('L') {
        return Ok(DayOfWeek::Last { day: day(d)? });
    }
    field(text, "day-of-week", 1, 7, &WEEKDAYS).map(DayOfWeek::Days)
}

fn last_day(date: NaiveDate) -> u32 {
    let (y, m) = (date.year(), date.month());
    let first_of_next = if m == 12 {
        NaiveDate::from_ymd_opt(y + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(y, m + 1, 1)
    };
    first_of_next
        .and_then(|d| d.pred_opt())
        .map_or(28, |d| d.day())
}

fn is_weekday(date: Option<NaiveDate>) -> bool {
    date.is_some_and(|d| !matches!(d.weekday(), Weekday::Sat | Weekday::Sun))
}

/// The weekday nearest `target` in `date`'s month, never leaving it.
fn nearest_weekday(date: NaiveDate, target: u32, last: u32) -> u32 {
    let Some(t) = date.with_day(target) else {
        return 0;
    };
    match t.weekday() {
        Weekday::Sat if target == 1 => 3,
        Weekday::Sat => target - 1,
        Weekday::Sun if target == last => target - 2,
        Weekday::Sun => target + 1,
        _ => target,
    }
}

#[cfg(test)]
#[path = "expr_tests.rs"]
mod tests;
