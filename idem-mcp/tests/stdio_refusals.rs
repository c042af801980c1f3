//! Every call the server refuses gets an answer that says why, over the
//! stdio transport's framing (one JSON-RPC message per line), written here
//! by hand: a call too large for the transport, `arguments` that are not
//! an object. The clock is paused, so a server that never answers shows as
//! the whole runtime going idle (the wait for the reply ends at once), not
//! as a test that hangs or waits.

use std::time::Duration;

use idem::{tool, Classify, Ctx, Failure, Runtime, Toolbox};
use idem_mcp::McpServer;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, ReadHalf, WriteHalf};

#[derive(Debug)]
struct Never;

impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("never")
    }
}

impl Classify for Never {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

/// Echoes the length of a note.
#[tool(class = "read_only")]
async fn note_length(_ctx: &Ctx, note: String) -> Result<usize, Never> {
    Ok(note.len())
}

/// A client that writes its JSON-RPC lines itself.
struct Raw {
    read: BufReader<ReadHalf<DuplexStream>>,
    write: WriteHalf<DuplexStream>,
}

impl Raw {
    /// Connects to `server` and makes the MCP handshake.
    async fn connect(server: McpServer) -> Raw {
        let (client, served) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let (r, w) = tokio::io::split(served);
            let _ = server.serve((r, w)).await;
        });
        let (read, write) = tokio::io::split(client);
        let mut raw = Raw {
            read: BufReader::new(read),
            write,
        };
        let init = json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": { "name": "raw", "version": "0" },
            },
        });
        raw.send(init.to_string().as_bytes()).await;
        let answer = raw.reply(0).await.expect("the handshake is answered");
        assert!(answer.get("result").is_some(), "{answer}");
        raw.send(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .await;
        raw
    }

    async fn send(&mut self, line: &[u8]) {
        self.write.write_all(line).await.unwrap();
        self.write.write_all(b"\n").await.unwrap();
        self.write.flush().await.unwrap();
    }

    /// The reply to request `id`, or `None` when the server went idle
    /// without one (on the paused clock, the timeout fires only then).
    async fn reply(&mut self, id: u64) -> Option<Value> {
        loop {
            let mut line = String::new();
            let read =
                tokio::time::timeout(Duration::from_secs(3600), self.read.read_line(&mut line))
                    .await;
            match read {
                Err(_) | Ok(Ok(0)) => return None,
                Ok(Ok(_)) => {}
                Ok(Err(e)) => panic!("reading the reply: {e}"),
            }
            let v: Value = serde_json::from_str(&line).expect("a JSON line");
            if v["id"] == id {
                return Some(v);
            }
        }
    }
}

fn server(rt: &Runtime) -> McpServer {
    let tools = Toolbox::new().with_function("note_length").unwrap();
    McpServer::new(rt.clone(), tools).unwrap()
}

/// A `tools/call` of `note_length` with `arguments` as given, and `id`.
fn call(id: u64, arguments: &str) -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"note_length","arguments":{arguments},"_meta":{{"idem/run":"r"}}}}}}"#
    )
    .into_bytes()
}

/// The refusal in an answer: an `isError` result's structured content.
fn refusal(answer: &Value) -> &Value {
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    &answer["result"]["structuredContent"]
}

#[tokio::test(start_paused = true)]
async fn a_call_larger_than_the_transport_takes_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let mut client = Raw::connect(server(&rt)).await;
    let note = "x".repeat(17 << 20);

    client
        .send(&call(1, &json!({ "note": note }).to_string()))
        .await;
    let answer = client.reply(1).await.expect("the 17 MiB call is answered");
    let s = refusal(&answer);
    assert_eq!(s["error"], "too_large", "{s}");
    let message = s["message"].as_str().unwrap();
    assert!(message.contains("16777216"), "{message}");
    assert!(message.contains("nothing was run"), "{message}");

    // The id may come last; the answer still finds it.
    let last = format!(
        r#"{{"jsonrpc":"2.0","method":"tools/call","params":{{"name":"note_length","arguments":{{"note":"{note}"}}}},"id":2}}"#
    );
    client.send(last.as_bytes()).await;
    let answer = client
        .reply(2)
        .await
        .expect("answered with the id at the end");
    assert_eq!(refusal(&answer)["error"], "too_large");

    // The connection goes on: a call of normal size runs.
    client.send(&call(3, r#"{"note":"abc"}"#)).await;
    let answer = client.reply(3).await.expect("a normal call is answered");
    assert_eq!(
        answer["result"]["structuredContent"]["result"], 3,
        "{answer}"
    );
}

#[tokio::test(start_paused = true)]
async fn arguments_that_are_not_an_object_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let mut client = Raw::connect(server(&rt)).await;
    for (id, arguments, kind) in [
        (1, r#"["abc"]"#, "an array"),
        (2, r#""note=abc""#, "a string"),
        (3, "7", "a number"),
    ] {
        client.send(&call(id, arguments)).await;
        let answer = client
            .reply(id)
            .await
            .unwrap_or_else(|| panic!("arguments {arguments} got no answer"));
        let s = refusal(&answer);
        assert_eq!(s["error"], "invalid_arguments", "{s}");
        let message = s["message"].as_str().unwrap();
        assert!(
            message.contains(&format!(
                "must be a JSON object of the tool's parameters, not {kind}"
            )),
            "{message}"
        );
    }
}
