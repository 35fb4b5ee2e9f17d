//! Time is read here and passed into the domain, never read inside it.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// Wall-clock milliseconds since the epoch, with an offset that tests may
/// move forward to expire leases without sleeping.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    offset_ms: Arc<AtomicI64>,
}

impl Clock {
    pub fn now_ms(&self) -> i64 {
        let real = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        real + self.offset_ms.load(Ordering::Relaxed)
    }

    pub fn advance(&self, ms: i64) {
        self.offset_ms.fetch_add(ms, Ordering::Relaxed);
    }
}

/// RFC 3339 in UTC with exactly three decimals, so timestamps also sort as text.
pub fn rfc3339(ms: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let fmt = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    t.format(&fmt).unwrap_or_else(|_| ms.to_string())
}

/// Milliseconds since the epoch of an RFC 3339 timestamp (as [`rfc3339`]
/// writes them, or any offset).
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let t =
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamps_read_back() {
        let ms = 1_700_000_000_123;
        assert_eq!(super::parse_rfc3339(&super::rfc3339(ms)), Some(ms));
        assert_eq!(super::parse_rfc3339("yesterday"), None);
    }

    #[test]
    fn timestamps_have_fixed_width() {
        assert_eq!(
            super::rfc3339(1_700_000_000_000),
            "2023-11-14T22:13:20.000Z"
        );
        assert_eq!(
            super::rfc3339(1_700_000_000_050),
            "2023-11-14T22:13:20.050Z"
        );
    }
}
