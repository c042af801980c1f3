//! Which arguments of a call differ from those its operation was recorded
//! with: pure, on the canonical JSON both are stored as.

use serde_json::{Map, Value};

/// The top-level argument names whose values differ between `recorded`
/// and `called` (the canonical JSON objects of the non-redacted
/// arguments), sorted; an argument present on one side only counts as
/// changed. Redacted and opaque arguments are recorded as the same
/// stand-in every time, so they never count.
///
/// Fails closed: when the recorded arguments are unavailable (not stored,
/// or not an object), every argument of the call counts as changed; when
/// neither side can be read, `["*"]`.
pub fn drifted_fields(recorded: &str, called: &str) -> Vec<String> {
    let called = object(called);
    let Some(recorded) = object(recorded) else {
        return match called {
            Some(c) if !c.is_empty() => c.keys().cloned().collect(),
            _ => vec!["*".to_string()],
        };
    };
    let called = called.unwrap_or_default();
    let mut names: Vec<String> = recorded
        .iter()
        .filter(|(k, v)| called.get(*k) != Some(v))
        .map(|(k, _)| k.clone())
        .chain(
            called
                .keys()
                .filter(|k| !recorded.contains_key(*k))
                .cloned(),
        )
        .collect();
    names.sort();
    names.dedup();
    names
}

fn object(json: &str) -> Option<Map<String, Value>> {
    match serde_json::from_str(json) {
        Ok(Value::Object(map)) => Some(map),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::drifted_fields;

    #[test]
    fn names_the_fields_whose_values_differ() {
        let recorded = r#"{"amount":100,"iban":"DE1","memo":"a"}"#;
        let called = r#"{"amount":100,"iban":"DE1","memo":"b"}"#;
        assert_eq!(drifted_fields(recorded, called), ["memo"]);
        assert!(drifted_fields(recorded, recorded).is_empty());
    }

    #[test]
    fn a_field_on_one_side_only_has_changed() {
        let recorded = r#"{"a":1,"gone":2}"#;
        let called = r#"{"a":1,"new":3}"#;
        assert_eq!(drifted_fields(recorded, called), ["gone", "new"]);
    }

    #[test]
    fn unavailable_recorded_arguments_count_as_all_changed() {
        let called = r#"{"amount":1,"iban":"DE1"}"#;
        assert_eq!(drifted_fields("", called), ["amount", "iban"]);
        assert_eq!(drifted_fields("", ""), ["*"]);
        // A call without fields names none: still something changed.
        assert_eq!(drifted_fields("", "{}"), ["*"]);
    }
}
