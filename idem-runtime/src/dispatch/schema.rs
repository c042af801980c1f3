//! [`ArgSchema`]: the JSON schema of a tool parameter's type, built in for
//! the standard types and implemented by hand for others.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

use serde_json::{json, Value};

/// The JSON schema of a type's serde form, for the argument schemas that
/// `#[tool]` generates (see [`tool_schemas`](crate::tool_schemas)).
///
/// Implemented for the standard types (integers with their ranges, floats,
/// `bool`, `char`, strings, `Option`, sequences, sets, maps, tuples,
/// arrays, smart pointers, `serde_json::Value`). For a type of your own,
/// implement it by hand, or enable the facade's `schemars` feature and
/// derive `schemars::JsonSchema`; a parameter type with neither is
/// described by the empty schema `{}` (any JSON value), and still decoded
/// and checked by its `Deserialize` when the tool is called.
///
/// ```
/// use idem::ArgSchema;
/// use serde_json::{json, Value};
///
/// #[derive(serde::Deserialize)]
/// struct Address {
///     street: String,
///     city: String,
/// }
///
/// impl ArgSchema for Address {
///     fn arg_schema() -> Value {
///         json!({
///             "type": "object",
///             "properties": { "street": String::arg_schema(), "city": String::arg_schema() },
///             "required": ["street", "city"],
///         })
///     }
/// }
/// assert_eq!(Address::arg_schema()["properties"]["city"], json!({ "type": "string" }));
/// ```
pub trait ArgSchema {
    /// The schema, as a JSON object.
    fn arg_schema() -> Value;
}

macro_rules! integers {
    ($($t:ty),*) => {$(
        impl ArgSchema for $t {
            fn arg_schema() -> Value {
                json!({ "type": "integer", "minimum": <$t>::MIN, "maximum": <$t>::MAX })
            }
        }
    )*};
}
integers!(u8, u16, u32, i8, i16, i32);

// Bounds past 2^53 are not exact in every JSON reader (JavaScript's): only
// the sign is stated.
macro_rules! unsigned_wide {
    ($($t:ty),*) => {$(
        impl ArgSchema for $t {
            fn arg_schema() -> Value {
                json!({ "type": "integer", "minimum": 0 })
            }
        }
    )*};
}
unsigned_wide!(u64, u128);

macro_rules! signed_wide {
    ($($t:ty),*) => {$(
        impl ArgSchema for $t {
            fn arg_schema() -> Value {
                json!({ "type": "integer" })
            }
        }
    )*};
}
signed_wide!(i64, i128);

impl ArgSchema for usize {
    fn arg_schema() -> Value {
        u64::arg_schema()
    }
}

impl ArgSchema for isize {
    fn arg_schema() -> Value {
        i64::arg_schema()
    }
}

impl ArgSchema for f32 {
    fn arg_schema() -> Value {
        json!({ "type": "number" })
    }
}

impl ArgSchema for f64 {
    fn arg_schema() -> Value {
        json!({ "type": "number" })
    }
}

impl ArgSchema for bool {
    fn arg_schema() -> Value {
        json!({ "type": "boolean" })
    }
}

impl ArgSchema for char {
    fn arg_schema() -> Value {
        json!({ "type": "string", "minLength": 1, "maxLength": 1 })
    }
}

impl ArgSchema for () {
    fn arg_schema() -> Value {
        json!({ "type": "null" })
    }
}

macro_rules! strings {
    ($($t:ty),*) => {$(
        impl ArgSchema for $t {
            fn arg_schema() -> Value {
                json!({ "type": "string" })
            }
        }
    )*};
}
strings!(String, str, PathBuf);

impl ArgSchema for Cow<'_, str> {
    fn arg_schema() -> Value {
        String::arg_schema()
    }
}

impl ArgSchema for Value {
    fn arg_schema() -> Value {
        json!({})
    }
}

impl ArgSchema for serde_json::Map<String, Value> {
    fn arg_schema() -> Value {
        json!({ "type": "object" })
    }
}

/// `Option<T>`: `T`, or `null`. (An absent argument of this type is `None`:
/// the generated schema does not list it as required.)
impl<T: ArgSchema> ArgSchema for Option<T> {
    fn arg_schema() -> Value {
        let inner = T::arg_schema();
        match inner.get("type") {
            Some(Value::String(t)) => {
                let mut with_null = inner.clone();
                with_null["type"] = json!([t, "null"]);
                with_null
            }
            _ => json!({ "anyOf": [inner, { "type": "null" }] }),
        }
    }
}

macro_rules! pointers {
    ($($p:ident),*) => {$(
        impl<T: ArgSchema + ?Sized> ArgSchema for $p<T> {
            fn arg_schema() -> Value {
                T::arg_schema()
            }
        }
    )*};
}
pointers!(Box, Arc, Rc);

impl<T: ArgSchema> ArgSchema for [T] {
    fn arg_schema() -> Value {
        json!({ "type": "array", "items": T::arg_schema() })
    }
}

impl<T: ArgSchema, const N: usize> ArgSchema for [T; N] {
    fn arg_schema() -> Value {
        json!({ "type": "array", "items": T::arg_schema(), "minItems": N, "maxItems": N })
    }
}

macro_rules! sequences {
    ($($s:ident),*) => {$(
        impl<T: ArgSchema> ArgSchema for $s<T> {
            fn arg_schema() -> Value {
                <[T]>::arg_schema()
            }
        }
    )*};
}
sequences!(Vec, VecDeque);

impl<T: ArgSchema> ArgSchema for BTreeSet<T> {
    fn arg_schema() -> Value {
        json!({ "type": "array", "items": T::arg_schema(), "uniqueItems": true })
    }
}

impl<T: ArgSchema, S> ArgSchema for HashSet<T, S> {
    fn arg_schema() -> Value {
        BTreeSet::<T>::arg_schema()
    }
}

/// Maps are JSON objects: their keys are written as strings.
impl<K, V: ArgSchema> ArgSchema for BTreeMap<K, V> {
    fn arg_schema() -> Value {
        json!({ "type": "object", "additionalProperties": V::arg_schema() })
    }
}

impl<K, V: ArgSchema, S> ArgSchema for HashMap<K, V, S> {
    fn arg_schema() -> Value {
        BTreeMap::<K, V>::arg_schema()
    }
}

macro_rules! tuples {
    ($(($($t:ident),+)),*) => {$(
        impl<$($t: ArgSchema),+> ArgSchema for ($($t,)+) {
            fn arg_schema() -> Value {
                let items = vec![$($t::arg_schema()),+];
                let n = items.len();
                json!({ "type": "array", "prefixItems": items, "minItems": n, "maxItems": n })
            }
        }
    )*};
}
tuples!(
    (A),
    (A, B),
    (A, B, C),
    (A, B, C, D),
    (A, B, C, D, F),
    (A, B, C, D, F, G)
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_types_describe_their_serde_form() {
        assert_eq!(
            u8::arg_schema(),
            json!({ "type": "integer", "minimum": 0, "maximum": 255 })
        );
        assert_eq!(
            Option::<String>::arg_schema(),
            json!({ "type": ["string", "null"] })
        );
        assert_eq!(
            Option::<Value>::arg_schema(),
            json!({ "anyOf": [{}, { "type": "null" }] })
        );
        assert_eq!(
            Vec::<bool>::arg_schema(),
            json!({ "type": "array", "items": { "type": "boolean" } })
        );
        assert_eq!(
            <(u8, String)>::arg_schema()["prefixItems"][1],
            json!({ "type": "string" })
        );
        assert_eq!(
            BTreeMap::<String, u64>::arg_schema()["additionalProperties"]["type"],
            "integer"
        );
    }
}
