//! `cargo run --example llm_loop` is how a function-calling loop uses idem;
//! this test runs the same loop and checks what it printed and did.

#[allow(dead_code)]
#[path = "../examples/llm_loop.rs"]
mod llm_loop;

#[tokio::test]
async fn the_loop_runs_each_operation_once_and_says_what_was_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let mut out = Vec::new();
    let summary = llm_loop::run(&dir.path().join("journal"), &mut out)
        .await
        .unwrap();
    let text = String::from_utf8(out).unwrap();
    println!("{text}");

    assert_eq!(
        summary,
        llm_loop::Summary {
            ran: 3,
            replayed: 3,
            refused: vec!["args_mismatch", "unknown_tool"],
            charges: 1,
            emails: 1,
        },
        "{text}"
    );
    let lines: Vec<&str> = text.lines().collect();
    // The model was shown the three tools with their schemas.
    assert!(lines
        .iter()
        .any(|l| l.starts_with("  \"charge\" (\"provider\"): {")
            && l.contains(
                "\"required\":[\"order_id\",\"customer\",\"amount_cents\",\"currency\"]"
            )));
    // The reworded receipt is replayed, with the drift noted; the other
    // amount is refused with what the model may do.
    assert!(
        lines.contains(&"model calls send_receipt {\"body\":\"Thanks for your order 4711!\",\"order_id\":4711,\"to\":\"ann@example.com\"}"),
        "{text}"
    );
    assert!(
        text.contains("  replayed from the journal (arguments drifted): {"),
        "{text}"
    );
    assert!(text.contains("\"error\":\"args_mismatch\""), "{text}");
    assert!(
        text.contains("call again with the original arguments"),
        "{text}"
    );
    assert!(text.contains("\"error\":\"unknown_tool\""), "{text}");
    assert!(
        text.ends_with(
            "8 calls: 3 ran, 3 replayed, 2 refused (args_mismatch, unknown_tool); at the \
             providers: 1 charge, 1 email\n"
        ),
        "{text}"
    );
}
