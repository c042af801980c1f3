use idem::{tool, Classify, Ctx, Failure, ToolError};

#[derive(Debug)]
struct SmsError;
impl Classify for SmsError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

#[tool(class = "journal", key = "to", verify = "none", retry(initial = "1ms"))]
async fn send_sms(ctx: &Ctx, to: String) -> Result<(), SmsError> {
    let _ = (ctx, to);
    Err(SmsError)
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let rt = idem::Runtime::open(dir.path()).unwrap();
    let ctx = rt.run("sms");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = runtime.block_on(send_sms(&ctx, "+49".into())).unwrap_err();
    // Nothing can tell whether the SMS went out: a human decides.
    assert!(matches!(err, ToolError::Escalated { .. }));
    assert_eq!(runtime.block_on(rt.escalations()).unwrap().len(), 1);
}
