//! The expressions AWS documents for EventBridge Scheduler and rules, and
//! daylight saving in America/New_York.

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;

use super::*;

fn utc(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

fn next(expr: &str, tz: Tz, after: &str, n: usize) -> Vec<String> {
    let e = Expression::parse(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
    let after = utc(after);
    e.next_n(tz, after, after, n)
        .into_iter()
        .map(|t| t.with_timezone(&tz).to_rfc3339())
        .collect()
}

const SAT: &str = "2026-12-05T12:00:00Z";

#[test]
fn the_documented_cron_examples_fire_when_aws_says() {
    let utc_tz = chrono_tz::UTC;
    // 10:00 every day.
    assert_eq!(
        next("cron(0 10 * * ? *)", utc_tz, SAT, 2),
        ["2026-12-06T10:00:00+00:00", "2026-12-07T10:00:00+00:00"]
    );
    // 12:15 every day.
    assert_eq!(
        next("cron(15 12 * * ? *)", utc_tz, SAT, 1),
        ["2026-12-05T12:15:00+00:00"]
    );
    // 18:00 Monday to Friday.
    assert_eq!(
        next("cron(0 18 ? * MON-FRI *)", utc_tz, SAT, 2),
        ["2026-12-07T18:00:00+00:00", "2026-12-08T18:00:00+00:00"]
    );
    // 08:00 on the first day of every month.
    assert_eq!(
        next("cron(0 8 1 * ? *)", utc_tz, SAT, 2),
        ["2027-01-01T08:00:00+00:00", "2027-02-01T08:00:00+00:00"]
    );
    // Every 15 minutes.
    assert_eq!(
        next("cron(0/15 * * * ? *)", utc_tz, SAT, 3),
        [
            "2026-12-05T12:15:00+00:00",
            "2026-12-05T12:30:00+00:00",
            "2026-12-05T12:45:00+00:00"
        ]
    );
    // Every 10 minutes, Monday to Friday.
    assert_eq!(
        next("cron(0/10 * ? * MON-FRI *)", utc_tz, SAT, 2),
        ["2026-12-07T00:00:00+00:00", "2026-12-07T00:10:00+00:00"]
    );
    // Every 5 minutes between 08:00 and 17:55, Monday to Friday.
    let five = next(
        "cron(0/5 8-17 ? * MON-FRI *)",
        utc_tz,
        "2026-12-07T17:50:00Z",
        3,
    );
    assert_eq!(
        five,
        [
            "2026-12-07T17:55:00+00:00",
            "2026-12-08T08:00:00+00:00",
            "2026-12-08T08:05:00+00:00"
        ]
    );
    // 09:00 on the first Monday of every month.
    assert_eq!(
        next("cron(0 9 ? * 2#1 *)", utc_tz, SAT, 2),
        ["2026-12-07T09:00:00+00:00", "2027-01-04T09:00:00+00:00"]
    );
    // 10:15 on the last Friday of every month, in the years given.
    assert_eq!(
        next("cron(15 10 ? * 6L 2026-2027)", utc_tz, SAT, 2),
        ["2026-12-25T10:15:00+00:00", "2027-01-29T10:15:00+00:00"]
    );
    assert!(next("cron(15 10 ? * 6L 2020-2022)", utc_tz, SAT, 1).is_empty());
    // The last day, the last weekday, the weekday nearest the 1st.
    assert_eq!(
        next("cron(0 0 L * ? *)", utc_tz, SAT, 1),
        ["2026-12-31T00:00:00+00:00"]
    );
    assert_eq!(
        next("cron(0 0 LW 1 ? *)", utc_tz, SAT, 1),
        ["2027-01-29T00:00:00+00:00"]
    );
    // 1 May 2027 is a Saturday: its nearest weekday in the month is Monday the 3rd.
    assert_eq!(
        next("cron(0 0 1W 5 ? 2027)", utc_tz, SAT, 1),
        ["2027-05-03T00:00:00+00:00"]
    );
    // Names and lists.
    assert_eq!(
        next("cron(0 12 ? JAN,JUL SUN,SAT *)", utc_tz, SAT, 1),
        ["2027-01-02T12:00:00+00:00"]
    );
}

#[test]
fn a_schedules_times_are_its_time_zones_with_their_offset() {
    let berlin: Tz = "Europe/Berlin".parse().unwrap();
    assert_eq!(
        next("cron(0 10 ? * MON *)", berlin, SAT, 1),
        ["2026-12-07T10:00:00+01:00"]
    );
    assert_eq!(
        next("at(2027-07-01T09:30:00)", berlin, SAT, 2),
        ["2027-07-01T09:30:00+02:00"],
        "once, in summer time"
    );
}

#[test]
fn daylight_saving_skips_a_missing_time_and_fires_a_doubled_one_once() {
    let ny: Tz = "America/New_York".parse().unwrap();
    // 8 March 2026: 02:00 jumps to 03:00, so 02:30 does not happen that day.
    assert_eq!(
        next("cron(30 2 * * ? *)", ny, "2026-03-07T00:00:00Z", 3),
        [
            "2026-03-07T02:30:00-05:00",
            "2026-03-09T02:30:00-04:00",
            "2026-03-10T02:30:00-04:00"
        ]
    );
    // 1 November 2026: 02:00 falls back to 01:00, so 01:30 happens twice
    // and fires once, at the first.
    assert_eq!(
        next("cron(30 1 * * ? *)", ny, "2026-10-31T12:00:00Z", 3),
        [
            "2026-11-01T01:30:00-04:00",
            "2026-11-02T01:30:00-05:00",
            "2026-11-03T01:30:00-05:00"
        ]
    );
    let half_hourly = next("cron(0/30 * * * ? *)", ny, "2026-11-01T04:45:00Z", 3);
    assert_eq!(
        half_hourly,
        [
            "2026-11-01T01:00:00-04:00",
            "2026-11-01T01:30:00-04:00",
            "2026-11-01T02:00:00-05:00"
        ]
    );
}

#[test]
fn rates_count_from_the_schedules_start() {
    let start = utc("2026-12-05T12:00:00Z");
    let e = Expression::parse("rate(5 minutes)").unwrap();
    let times: Vec<String> = e
        .next_n(chrono_tz::UTC, utc("2026-12-05T12:07:00Z"), start, 2)
        .iter()
        .map(|t| t.to_rfc3339())
        .collect();
    assert_eq!(
        times,
        ["2026-12-05T12:10:00+00:00", "2026-12-05T12:15:00+00:00"]
    );
    for (text, every_s) in [
        ("rate(1 minute)", 60),
        ("rate(1 hour)", 3600),
        ("rate(12 hours)", 43_200),
        ("rate(1 day)", 86_400),
        ("rate(7 days)", 604_800),
    ] {
        assert_eq!(
            Expression::parse(text),
            Ok(Expression::Rate { every_s }),
            "{text}"
        );
    }
}

#[test]
fn anything_else_is_refused_saying_what_is_wrong() {
    for (text, says) in [
        ("rate(1 minutes)", "singular only for 1"),
        ("rate(5 minute)", "singular only for 1"),
        ("rate(0 minutes)", "positive"),
        ("rate(5 weeks)", "minute(s), hour(s) or day(s)"),
        ("cron(0 10 * * *)", "six fields"),
        ("cron(0 10 * * * *)", "cannot both be given"),
        ("cron(0 10 ? * ? *)", "exactly one must be '?'"),
        ("cron(60 10 * * ? *)", "minutes: '60'"),
        ("cron(0 24 * * ? *)", "hours: '24'"),
        ("cron(0 10 32 * ? *)", "day-of-month: '32'"),
        ("cron(0 10 ? FOO * *)", "month: 'FOO'"),
        ("cron(0 10 ? * 8 *)", "day-of-week: '8'"),
        ("cron(0 10 ? * 2#6 *)", "the week must be 1-5"),
        ("cron(0 10 * * ? 2200)", "year: '2200'"),
        ("cron(0 10 5-1 * ? *)", "must go up"),
        ("cron(0/0 10 * * ? *)", "positive number"),
        ("at(2026-12-05 10:00)", "yyyy-mm-ddThh:mm:ss"),
        ("every day", "cron(...), rate(...) or at(...)"),
    ] {
        let e = Expression::parse(text).unwrap_err();
        assert!(e.0.contains(says), "{text}: {e}");
    }
}

#[test]
fn an_at_schedule_fires_once_and_never_after() {
    let e = Expression::parse("at(2026-12-05T12:30:00)").unwrap();
    let after = utc(SAT);
    let at = e.next_after(chrono_tz::UTC, after, after).unwrap();
    assert_eq!(at, Utc.with_ymd_and_hms(2026, 12, 5, 12, 30, 0).unwrap());
    assert_eq!(e.next_after(chrono_tz::UTC, at, after), None);
}
