//! What an HTTP status means for the real world.

use std::time::SystemTime;

use idem_runtime::Failure;
use reqwest::header::HeaderMap;
use reqwest::StatusCode;

use crate::retry_after::retry_after;

/// Classifies a response the caller treats as a failure.
///
/// | status | failure | why |
/// |---|---|---|
/// | 408, 425, 429 | `NotSent`, `Retry-After` as floor | the server refused to process it: timed out reading it, too early, rate limited |
/// | 409 on a keyed request | `Ambiguous`, `Retry-After` as floor | the provider is still processing an earlier request with our key: it may land |
/// | 5xx | `Ambiguous`, `Retry-After` as floor | the server failed somewhere, perhaps after applying it |
/// | 409 without a key, 400, 402, 422, every other 4xx | `Semantic` | the provider understood and refused: a retry repeats the refusal |
/// | anything else (1xx, 2xx, 3xx, ≥ 600) | `Ambiguous`, `Retry-After` as floor | a response the caller could not use: the request reached the provider and may have been applied |
///
/// `keyed` says whether the request carried an `Idempotency-Key`. A 409 on
/// a keyed request is the IETF draft's and Stripe's "a request with this key
/// is in flight": `Ambiguous` makes a provider-class tool retry the same key
/// (after the backoff, and no sooner than `Retry-After`) until the first
/// request finishes and the provider replays its outcome, while a journal
/// tool asks `verify` and an at-most-once tool escalates, since the first
/// request may still land. `NotSent` would let those two re-run blindly,
/// and `Semantic` would record a refusal and send the next call under a
/// fresh key: a duplicate.
///
/// A `Retry-After` date is measured from the response's `Date`, else from
/// the system clock; see [`classify_status_at`] to give the clock.
///
/// ```
/// use idem::http::classify_status;
/// use idem::Failure;
/// use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};
/// use reqwest::StatusCode;
/// use std::time::Duration;
///
/// let mut headers = HeaderMap::new();
/// headers.insert(RETRY_AFTER, HeaderValue::from_static("30"));
/// assert_eq!(
///     classify_status(StatusCode::TOO_MANY_REQUESTS, &headers, true),
///     Failure::NotSent { retry_after: Some(Duration::from_secs(30)) },
/// );
/// assert_eq!(classify_status(StatusCode::PAYMENT_REQUIRED, &headers, true), Failure::Semantic);
/// ```
pub fn classify_status(status: StatusCode, headers: &HeaderMap, keyed: bool) -> Failure {
    classify_status_at(status, headers, keyed, SystemTime::now())
}

/// [`classify_status`] with the clock given: `now` is when the response
/// arrived (only used for a `Retry-After` date in a response without a
/// valid `Date`).
pub fn classify_status_at(
    status: StatusCode,
    headers: &HeaderMap,
    keyed: bool,
    now: SystemTime,
) -> Failure {
    let floor = || retry_after(headers, now);
    match status.as_u16() {
        408 | 425 | 429 => Failure::NotSent {
            retry_after: floor(),
        },
        409 if keyed => Failure::Ambiguous {
            retry_after: floor(),
        },
        400..=499 => Failure::Semantic,
        _ => Failure::Ambiguous {
            retry_after: floor(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderValue, RETRY_AFTER};
    use std::time::Duration;

    fn now() -> SystemTime {
        // 1994-11-06 08:49:37 UTC
        SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777)
    }

    fn with_retry_after(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_str(value).unwrap());
        h
    }

    fn classify(code: u16, headers: &HeaderMap, keyed: bool) -> Failure {
        classify_status_at(StatusCode::from_u16(code).unwrap(), headers, keyed, now())
    }

    const SECONDS: &str = "17";
    const DATE: &str = "Sun, 06 Nov 1994 08:49:54 GMT"; // now + 17 s

    #[test]
    fn not_processed_statuses_are_not_sent_with_either_retry_after_form() {
        for code in [408, 425, 429] {
            for keyed in [true, false] {
                for form in [SECONDS, DATE] {
                    assert_eq!(
                        classify(code, &with_retry_after(form), keyed),
                        Failure::NotSent {
                            retry_after: Some(Duration::from_secs(17))
                        },
                        "{code} {form}"
                    );
                }
                assert_eq!(
                    classify(code, &HeaderMap::new(), keyed),
                    Failure::not_sent()
                );
                assert_eq!(
                    classify(code, &with_retry_after("later"), keyed),
                    Failure::not_sent(),
                    "malformed: no floor"
                );
                assert_eq!(
                    classify(
                        code,
                        &with_retry_after("Sun, 06 Nov 1994 08:00:00 GMT"),
                        keyed
                    ),
                    Failure::not_sent(),
                    "past: no floor"
                );
            }
        }
    }

    #[test]
    fn conflict_on_a_keyed_request_is_in_flight() {
        for form in [SECONDS, DATE] {
            assert_eq!(
                classify(409, &with_retry_after(form), true),
                Failure::Ambiguous {
                    retry_after: Some(Duration::from_secs(17))
                }
            );
        }
        assert_eq!(classify(409, &HeaderMap::new(), true), Failure::ambiguous());
        // Without our key it is the provider's own conflict: a refusal.
        assert_eq!(
            classify(409, &with_retry_after(SECONDS), false),
            Failure::Semantic
        );
    }

    #[test]
    fn server_errors_are_ambiguous_with_the_floor() {
        for code in [500, 501, 502, 503, 504, 599] {
            assert_eq!(
                classify(code, &HeaderMap::new(), true),
                Failure::ambiguous()
            );
            for form in [SECONDS, DATE] {
                assert_eq!(
                    classify(code, &with_retry_after(form), false),
                    Failure::Ambiguous {
                        retry_after: Some(Duration::from_secs(17))
                    }
                );
            }
        }
    }

    #[test]
    fn other_client_errors_are_semantic() {
        for code in [400, 401, 402, 403, 404, 405, 410, 413, 415, 422, 451, 499] {
            assert_eq!(
                classify(code, &with_retry_after(SECONDS), true),
                Failure::Semantic,
                "{code}"
            );
        }
    }

    #[test]
    fn unusable_non_error_statuses_fail_closed() {
        for code in [100, 200, 201, 204, 301, 303, 304, 307, 600, 999] {
            assert_eq!(
                classify(code, &HeaderMap::new(), true),
                Failure::ambiguous(),
                "{code}"
            );
        }
    }
}
