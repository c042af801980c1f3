//! The few W3C WebDriver commands the browser test needs, over HTTP to a
//! chromedriver this test starts, driving headless Chromium.

// Shared by the browser tests; each uses some of it.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

/// The W3C element reference key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver process and one browser session in it.
pub struct Browser {
    http: reqwest::Client,
    session: String,
    driver: tokio::process::Child,
    _profile: tempfile::TempDir,
}

/// An element of the page.
#[derive(Clone, Debug)]
pub struct Element(String);

fn find_program(name: &str, fallbacks: &[&str]) -> String {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        if dir.join(name).is_file() {
            return dir.join(name).display().to_string();
        }
    }
    for f in fallbacks {
        if Path::new(f).is_file() {
            return f.to_string();
        }
    }
    panic!(
        "{name} not found: the browser test needs Chromium and its driver \
         (Debian packages chromium and chromium-driver; .ci/run installs them)"
    )
}

impl Browser {
    /// Starts chromedriver on a free loopback port and opens a headless
    /// Chromium session.
    pub async fn start() -> Browser {
        let driver_bin = find_program("chromedriver", &["/usr/lib/chromium/chromedriver"]);
        let chromium = find_program("chromium", &["/usr/lib/chromium/chromium"]);
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let driver = tokio::process::Command::new(driver_bin)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let base = format!("http://127.0.0.1:{port}");
        // Wait for the driver itself to answer.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(a) = http.get(format!("{base}/status")).send().await {
                if a.status().is_success() {
                    break;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "chromedriver did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                    "--window-size=1100,1250",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
        }}});
        let answer: Value = http
            .post(format!("{base}/session"))
            .body(caps.to_string())
            .send()
            .await
            .expect("new session")
            .json_value()
            .await;
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {answer}"))
            .to_string();
        Browser {
            http,
            session: format!("{base}/session/{session}"),
            driver,
            _profile: profile,
        }
    }

    async fn command(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, Value> {
        let mut req = self
            .http
            .request(method.parse().unwrap(), format!("{}{path}", self.session));
        if let Some(b) = body {
            req = req.body(b.to_string());
        }
        let answer = req.send().await.expect("chromedriver answers");
        let ok = answer.status().is_success();
        let value = answer.json_value().await["value"].clone();
        if ok {
            Ok(value)
        } else {
            Err(value)
        }
    }

    /// Opens `url`.
    pub async fn goto(&self, url: &str) {
        self.command("POST", "/url", Some(json!({ "url": url })))
            .await
            .unwrap();
    }

    /// The first element matching `css`, if any now.
    pub async fn find(&self, css: &str) -> Option<Element> {
        match self
            .command(
                "POST",
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await
        {
            Ok(v) => Some(Element(
                v[ELEMENT]
                    .as_str()
                    .unwrap_or_else(|| panic!("find {css}: {v}"))
                    .to_string(),
            )),
            Err(e) if e["error"] == "no such element" => None,
            Err(e) => panic!("find {css}: {e}"),
        }
    }

    /// Waits for an element matching `css` whose text satisfies `test`.
    pub async fn wait_for(&self, css: &str, what: &str, test: impl Fn(&str) -> bool) -> Element {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut last = String::new();
        loop {
            if let Some(e) = self.find(css).await {
                if let Ok(text) = self.try_text(&e).await {
                    if test(&text) {
                        return e;
                    }
                    last = text;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {css} ({what}); last text: {last:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until no element matches `css`.
    pub async fn wait_gone(&self, css: &str, what: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.find(css).await.is_some() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {css} to go ({what})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn try_text(&self, e: &Element) -> Result<String, Value> {
        self.command("GET", &format!("/element/{}/text", e.0), None)
            .await
            .map(|v| v.as_str().unwrap_or_default().to_string())
    }

    /// An element's visible text.
    pub async fn text(&self, e: &Element) -> String {
        self.try_text(e).await.unwrap()
    }

    /// An element's `value` property (inputs, text areas).
    pub async fn value(&self, e: &Element) -> String {
        self.command("GET", &format!("/element/{}/property/value", e.0), None)
            .await
            .unwrap()
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Clicks it.
    pub async fn click(&self, e: &Element) {
        self.command("POST", &format!("/element/{}/click", e.0), Some(json!({})))
            .await
            .unwrap();
    }

    /// Replaces a text field's contents by typing `text`.
    pub async fn type_into(&self, e: &Element, text: &str) {
        self.command("POST", &format!("/element/{}/clear", e.0), Some(json!({})))
            .await
            .unwrap();
        self.command(
            "POST",
            &format!("/element/{}/value", e.0),
            Some(json!({ "text": text })),
        )
        .await
        .unwrap();
    }

    /// Whether it is displayed.
    pub async fn displayed(&self, e: &Element) -> bool {
        self.command("GET", &format!("/element/{}/displayed", e.0), None)
            .await
            .unwrap()
            .as_bool()
            .unwrap_or(false)
    }

    /// Runs a script in the page.
    pub async fn execute(&self, script: &str) -> Value {
        self.command(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
        .unwrap()
    }

    /// A PNG of the viewport.
    pub async fn screenshot(&self) -> Vec<u8> {
        let b64 = self.command("GET", "/screenshot", None).await.unwrap();
        base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap()
    }

    /// Ends the session and the driver.
    pub async fn close(mut self) {
        let _ = self.command("DELETE", "", None).await;
        let _ = self.driver.kill().await;
    }
}

trait JsonValue {
    async fn json_value(self) -> Value;
}

impl JsonValue for reqwest::Response {
    async fn json_value(self) -> Value {
        let text = self.text().await.unwrap_or_default();
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    }
}
