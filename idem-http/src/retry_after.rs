//! `Retry-After` (RFC 9110 §10.2.3): how long a provider asked us to wait.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, DATE, RETRY_AFTER};

/// The longest delay a `Retry-After` can ask for: about 136 years. A larger
/// value is clamped to it, so that no arithmetic on the delay can overflow
/// (the engine adds it to the time already spent); any budget is spent long
/// before, so the call gives up rather than waits.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(u32::MAX as u64);

/// The delay a response's `Retry-After` asks for, or `None` when there is
/// none, it is malformed, or its date is not in the future.
///
/// Both forms of RFC 9110 are read: delay-seconds (`Retry-After: 120`) and
/// an HTTP-date (`Retry-After: Wed, 21 Oct 2015 07:28:00 GMT`, and the
/// obsolete RFC 850 and asctime forms a recipient must accept). A date is
/// measured from the response's own `Date` header when it has a valid one,
/// so that a client whose clock is off still waits what the server meant;
/// from `now` otherwise.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use idem::http::retry_after;
/// use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};
///
/// let mut headers = HeaderMap::new();
/// headers.insert(RETRY_AFTER, HeaderValue::from_static("120"));
/// assert_eq!(retry_after(&headers, SystemTime::now()), Some(Duration::from_secs(120)));
/// ```
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    // Several values (or one repeated header) are not a valid field: no floor.
    let mut values = headers.get_all(RETRY_AFTER).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let value = value.to_str().ok()?.trim();
    if let Some(seconds) = delay_seconds(value) {
        return Some(seconds);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let reference = headers
        .get(DATE)
        .and_then(|d| d.to_str().ok())
        .and_then(|d| httpdate::parse_http_date(d.trim()).ok())
        .unwrap_or(now);
    match at.duration_since(reference) {
        Ok(d) if !d.is_zero() => Some(d.min(MAX_RETRY_AFTER)),
        // In the past, or now: the provider asks for no wait.
        _ => None,
    }
}

/// `delay-seconds = 1*DIGIT`: digits only, no sign, no fraction.
fn delay_seconds(value: &str) -> Option<Duration> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Digits only, so the one parse failure left is overflow: clamp it.
    let secs = value.parse::<u64>().unwrap_or(u64::MAX);
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    /// 1994-11-06 08:49:37 UTC, the instant RFC 9110's examples use.
    fn rfc_instant() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777)
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, HeaderValue::from_str(value).unwrap());
        }
        h
    }

    fn after(pairs: &[(&'static str, &str)], now: SystemTime) -> Option<Duration> {
        retry_after(&headers(pairs), now)
    }

    #[test]
    fn delay_seconds_form() {
        let now = rfc_instant();
        assert_eq!(after(&[("retry-after", "0")], now), Some(Duration::ZERO));
        assert_eq!(
            after(&[("retry-after", "7")], now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            after(&[("retry-after", " 120 ")], now),
            Some(Duration::from_secs(120))
        );
    }

    #[test]
    fn huge_delay_is_clamped_not_overflowed() {
        let now = rfc_instant();
        let huge = "9".repeat(40);
        assert_eq!(after(&[("retry-after", &huge)], now), Some(MAX_RETRY_AFTER));
        assert_eq!(
            after(&[("retry-after", "18446744073709551615")], now),
            Some(MAX_RETRY_AFTER)
        );
    }

    #[test]
    fn imf_fixdate_in_the_future() {
        let now = rfc_instant();
        assert_eq!(
            after(&[("retry-after", "Sun, 06 Nov 1994 08:51:37 GMT")], now),
            Some(Duration::from_secs(120))
        );
    }

    #[test]
    fn obsolete_date_forms() {
        let now = rfc_instant();
        // RFC 850
        assert_eq!(
            after(&[("retry-after", "Sunday, 06-Nov-94 08:50:37 GMT")], now),
            Some(Duration::from_secs(60))
        );
        // asctime
        assert_eq!(
            after(&[("retry-after", "Sun Nov  6 08:50:07 1994")], now),
            Some(Duration::from_secs(30))
        );
    }

    #[test]
    fn date_in_the_past_or_now_is_no_floor() {
        let now = rfc_instant();
        assert_eq!(
            after(&[("retry-after", "Sun, 06 Nov 1994 08:49:36 GMT")], now),
            None
        );
        assert_eq!(
            after(&[("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT")], now),
            None
        );
        assert_eq!(
            after(&[("retry-after", "Thu, 01 Jan 1970 00:00:00 GMT")], now),
            None
        );
    }

    #[test]
    fn date_is_measured_from_the_response_date() {
        // Our clock is an hour behind the server's: the server's Date wins.
        let now = rfc_instant() - Duration::from_secs(3600);
        assert_eq!(
            after(
                &[
                    ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
                    ("retry-after", "Sun, 06 Nov 1994 08:49:47 GMT"),
                ],
                now
            ),
            Some(Duration::from_secs(10))
        );
        // A Date that does not parse is ignored: measured from `now`.
        assert_eq!(
            after(
                &[
                    ("date", "yesterday"),
                    ("retry-after", "Sun, 06 Nov 1994 08:49:47 GMT")
                ],
                rfc_instant()
            ),
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn malformed_is_no_floor() {
        let now = rfc_instant();
        for bad in [
            "",
            "-5",
            "+5",
            "1.5",
            "5s",
            "soon",
            "0x10",
            "Sun, 06 Nov 1994 08:51:37",     // no zone
            "Sun, 06 Nov 1994 08:51:37 CET", // not GMT
            "Mon, 06 Nov 1994 08:51:37 GMT", // wrong weekday
            "Sun, 31 Nov 1994 08:51:37 GMT", // no such day
            "Sun, 06 Nov 1994 25:51:37 GMT",
        ] {
            assert_eq!(after(&[("retry-after", bad)], now), None, "{bad:?}");
        }
        assert_eq!(after(&[], now), None);
        // Two values are not one valid field.
        assert_eq!(
            after(&[("retry-after", "5"), ("retry-after", "6")], now),
            None
        );
        // Not visible ASCII.
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_bytes(b"5\xff").unwrap());
        assert_eq!(retry_after(&h, now), None);
    }
}
