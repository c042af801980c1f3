//! Two tools of one name in one binary would share keys, so a runtime
//! refuses to open. (`#[tool]` already makes such a binary fail to link,
//! tests/ui/link/duplicate_name.rs; these two are registered by hand, as a
//! build that gets past the link check would have them.)

use idem::__private::{inventory, RegisteredTool};
use idem::{Class, Error, Runtime, ToolDescriptor};

static MAIL_SEND: ToolDescriptor =
    ToolDescriptor::new("send", Class::Provider).defined_at("app::mail", "src/mail.rs", 12);

static SMS_SEND: ToolDescriptor =
    ToolDescriptor::new("send", Class::Journal).defined_at("app::sms", "src/sms.rs", 30);

inventory::submit! { RegisteredTool(&MAIL_SEND) }
inventory::submit! { RegisteredTool(&SMS_SEND) }

#[test]
fn a_runtime_does_not_open_with_two_tools_of_one_name() {
    let dir = tempfile::tempdir().unwrap();
    let Err(err) = Runtime::open(dir.path()) else {
        panic!("a runtime opened with two tools named `send`");
    };
    let Error::DuplicateTool {
        name,
        first,
        second,
    } = &err
    else {
        panic!("expected DuplicateTool, got {err:?}");
    };
    assert_eq!(name, "send");
    assert_eq!(first, "app::mail (src/mail.rs:12)");
    assert_eq!(second, "app::sms (src/sms.rs:30)");
    let text = err.to_string();
    assert!(
        text.contains("app::mail (src/mail.rs:12) and app::sms (src/sms.rs:30)"),
        "{text}"
    );
    // Refused before anything was written.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
