//! How results are stored: MessagePack with field names.
//!
//! JSON loses information serde can express (a non-finite float becomes
//! `null`, and `Option<f64>` then replays `None`), and bincode cannot
//! decode self-describing types (`serde_json::Value`, `#[serde(untagged)]`,
//! `flatten`). MessagePack keeps both: every float bit pattern, byte
//! strings, integers of every width, and it describes itself, so a stored
//! result decodes into the tool's type exactly, and into JSON for people.
//! Field names (rather than positions) keep a result readable after a
//! struct's fields are reordered.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Encodes a result for the journal.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, String> {
    rmp_serde::to_vec_named(value).map_err(|e| e.to_string())
}

/// Decodes a stored result into the tool's type.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    rmp_serde::from_slice(bytes).map_err(|e| e.to_string())
}

/// A stored result as JSON, for operators and tools that show it (lossy
/// only where JSON is: a non-finite float shows as `null`).
pub fn to_json(bytes: &[u8]) -> serde_json::Value {
    rmp_serde::from_slice(bytes).unwrap_or_else(|e| {
        serde_json::Value::String(format!("<stored result not readable as JSON: {e}>"))
    })
}

/// The check a tool's descriptor carries for an operator's `Landed`
/// result: JSON that decodes into the tool's result type `T`, stored as
/// that `T` would be. Refused with serde's message otherwise.
pub fn landed<T: Serialize + DeserializeOwned>(
    json: &serde_json::Value,
) -> Result<Vec<u8>, String> {
    let value: T = T::deserialize(json).map_err(|e| e.to_string())?;
    encode(&value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Receipt {
        amount: f64,
        fee: Option<f64>,
        raw: Vec<u8>,
        kind: Kind,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Kind {
        Card,
        Wire { iban: String },
    }

    #[test]
    fn results_replay_exactly() {
        let r = Receipt {
            amount: f64::INFINITY,
            fee: Some(f64::NEG_INFINITY),
            raw: vec![0, 255, 7],
            kind: Kind::Wire {
                iban: "DE00".into(),
            },
        };
        let back: Receipt = decode(&encode(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        let nan: f64 = decode(&encode(&f64::NAN).unwrap()).unwrap();
        assert!(nan.is_nan());
        let v = serde_json::json!({"k": [1, "two", {"x": null}], "n": -3});
        assert_eq!(
            decode::<serde_json::Value>(&encode(&v).unwrap()).unwrap(),
            v
        );
    }

    #[test]
    fn landed_json_must_fit_the_type() {
        let ok = serde_json::json!({"amount": 1.5, "fee": null, "raw": [1], "kind": "Card"});
        let stored = landed::<Receipt>(&ok).unwrap();
        assert_eq!(decode::<Receipt>(&stored).unwrap().kind, Kind::Card);
        let err = landed::<Receipt>(&serde_json::json!({"amount": "lots"})).unwrap_err();
        assert!(err.contains("invalid type"), "{err}");
        assert_eq!(to_json(&stored)["kind"], "Card");
    }
}
