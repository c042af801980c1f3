//! The inbox: one static page (HTML, a script and a style sheet, no build
//! step) served at `/`, listing the calls awaiting approval (approve or
//! reject, with a note), the escalations (resolve) and the sagas (read
//! only: where each stands, escalated ones first). It holds no data;
//! everything it shows it fetches from the API with the operator's token.

use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

use crate::body::Body;

/// One of the page's files.
pub(crate) enum Asset {
    Html,
    Js,
    Css,
}

const HTML: &str = include_str!("inbox/index.html");
const JS: &str = include_str!("inbox/inbox.js");
const CSS: &str = include_str!("inbox/inbox.css");

/// Scripts only from this origin (never inline), requests only to it, no
/// framing: what the page shows comes from tool arguments, approval
/// reasons, notes and provider errors, which are not trusted markup (the
/// script only sets text).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

pub(crate) fn page(asset: Asset) -> Response<Body> {
    let (text, content_type) = match asset {
        Asset::Html => (HTML, "text/html; charset=utf-8"),
        Asset::Js => (JS, "text/javascript; charset=utf-8"),
        Asset::Css => (CSS, "text/css; charset=utf-8"),
    };
    let mut answer = Response::new(Body::full(text));
    *answer.status_mut() = StatusCode::OK;
    let h = answer.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    answer
}
