//! A throwaway Prometheus server for tests: Debian's `prometheus` binary,
//! a config scraping one target, its storage in a fresh temporary
//! directory, its web API on a free port of 127.0.0.1.
//!
//! The server is killed when its [`Prometheus`] is dropped (a failing
//! test's unwinding included), and also when the thread that started it
//! ends (the kernel's parent-death signal), so that a test process killed
//! outright leaves no server behind.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The binary: `IDEM_PROMETHEUS`, else `/usr/bin/prometheus`, else
/// `prometheus` on the `PATH`.
pub fn binary() -> io::Result<PathBuf> {
    if let Some(path) = std::env::var_os("IDEM_PROMETHEUS") {
        return Ok(PathBuf::from(path));
    }
    let debian = Path::new("/usr/bin/prometheus");
    if debian.exists() {
        return Ok(debian.to_path_buf());
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("prometheus"))
        .find(|p| p.exists())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "the prometheus binary was not found: install Debian's `prometheus` package \
                 (apt-get install -y prometheus) or set IDEM_PROMETHEUS to it",
            )
        })
}

/// What to scrape.
#[derive(Debug, Clone)]
pub struct ScrapeTarget {
    /// The target's address (`host:port` of its HTTP server).
    pub addr: SocketAddr,
    /// The path of its metrics (`/metrics`).
    pub path: String,
    /// A bearer token to send, if it needs one.
    pub token: Option<String>,
    /// How often to scrape.
    pub interval: Duration,
}

/// One sample of an instant query's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series' labels, `__name__` included.
    pub labels: BTreeMap<String, String>,
    /// When it was taken (seconds since the epoch).
    pub at: f64,
    /// Its value.
    pub value: f64,
}

/// A running server; see the module documentation.
#[derive(Debug)]
pub struct Prometheus {
    child: Child,
    dir: PathBuf,
    addr: SocketAddr,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

impl Prometheus {
    /// Starts a server scraping `target` and waits (up to 30 s) until it
    /// answers as ready.
    pub async fn start(target: &ScrapeTarget) -> io::Result<Prometheus> {
        let bin = binary()?;
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("idem-prometheus-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data"))?;
        let mut auth = String::new();
        if let Some(token) = &target.token {
            let file = dir.join("token");
            std::fs::write(&file, token)?;
            auth = format!(
                "    authorization:\n      credentials_file: {}\n",
                yaml_string(&file.to_string_lossy())
            );
        }
        let interval = format!("{}ms", target.interval.as_millis().max(1));
        let config = format!(
            "global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n\
             scrape_configs:\n  - job_name: idem\n    metrics_path: {}\n{auth}    \
             static_configs:\n      - targets: [{}]\n",
            yaml_string(&target.path),
            yaml_string(&target.addr.to_string()),
        );
        std::fs::write(dir.join("prometheus.yml"), config)?;
        // A free port: bound, then let go for the server to take.
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let listen: SocketAddr = ([127, 0, 0, 1], port).into();
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let mut cmd = Command::new(&bin);
        cmd.arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={listen}"))
        .arg("--log.level=warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt as _;
            // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and
            // touches nothing of the parent's.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("starting {}: {e}", bin.display())))?;
        let mut server = Prometheus {
            child,
            dir,
            addr: listen,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = server.child.try_wait()? {
                return Err(io::Error::other(format!(
                    "prometheus exited ({status}) before it was ready: {}",
                    server.log()
                )));
            }
            if let Ok((200, _)) = server.get("/-/ready").await {
                return Ok(server);
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("prometheus not ready after 30 s: {}", server.log()),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One `GET` in HTTP/1.0 (the answer ends with the connection: no
    /// chunked coding to decode), within 10 s: status and body.
    async fn get(&self, target: &str) -> io::Result<(u16, String)> {
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(self.addr).await?;
            let request = format!("GET {target} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr);
            stream.write_all(request.as_bytes()).await?;
            let mut answer = Vec::new();
            stream.read_to_end(&mut answer).await?;
            let answer = String::from_utf8_lossy(&answer).into_owned();
            let (head, body) = answer
                .split_once("\r\n\r\n")
                .ok_or_else(|| io::Error::other(format!("no HTTP answer: {answer:?}")))?;
            let status = head
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| io::Error::other(format!("no status in {head:?}")))?;
            Ok((status, body.to_string()))
        };
        tokio::time::timeout(Duration::from_secs(10), exchange)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "prometheus did not answer"))?
    }

    /// What the server wrote to its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// An instant query (`/api/v1/query`) whose answer is a vector.
    pub async fn query(&self, expr: &str) -> io::Result<Vec<Sample>> {
        let target = format!("/api/v1/query?query={}", percent_encode(expr));
        let (status, text) = self.get(&target).await?;
        let body: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| io::Error::other(format!("prometheus answered {status}: {e}: {text}")))?;
        let bad = |why: &str| io::Error::other(format!("{why} in prometheus' answer {body}"));
        if body["status"] != "success" || body["data"]["resultType"] != "vector" {
            return Err(bad("no vector"));
        }
        let Some(results) = body["data"]["result"].as_array() else {
            return Err(bad("no result"));
        };
        results
            .iter()
            .map(|r| {
                let labels = r["metric"]
                    .as_object()
                    .ok_or_else(|| bad("a sample without labels"))?
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect();
                let at = r["value"][0].as_f64().ok_or_else(|| bad("no timestamp"))?;
                let value = r["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| bad("no value"))?;
                Ok(Sample { labels, at, value })
            })
            .collect()
    }

    /// Waits (up to `within`) until a scrape that began after `after`
    /// (seconds since the epoch) succeeded: its samples are then what the
    /// target served after that moment.
    pub async fn scraped_after(&self, after: f64, within: Duration) -> io::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let up = self.query("up").await?;
            if up.iter().any(|s| s.value == 1.0 && s.at > after) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no successful scrape after {after} within {within:?} (up: {up:?}): {}",
                        self.log()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A YAML double-quoted string.
fn yaml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// Everything but unreserved characters as `%XX`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
