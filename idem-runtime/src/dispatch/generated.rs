//! What the dispatchers that `#[tool]` generates are made of: their
//! registration, the argument reader, and the probes that decide, from the
//! types alone, whether a tool can be called with JSON at all.
//!
//! The probes use method resolution on references ("autoref
//! specialization"): `(&&&Probe::<T>::new()).method()` finds the impl for
//! `&&Probe<T>` when `T` meets its bounds, else the one for `&Probe<T>`, and
//! so on. The generated code therefore compiles for every tool, and a tool
//! whose types do not allow JSON simply reports itself unavailable.

use std::any::{Any, TypeId};
use std::cell::Cell;
use std::future::Future;
use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

use super::{BoxFuture, DispatchError};
use crate::ctx::Ctx;
use crate::error::ToolError;
use crate::failure::{Classify, Failure};

/// What a free function's dispatcher is.
pub type FreeCall = for<'a> fn(&'a Ctx, Value) -> BoxFuture<'a, Result<Value, DispatchError>>;

/// What a method's dispatcher is: the instance is an `Arc<Self>` behind
/// `dyn Any`.
pub type MethodCall = for<'a> fn(
    &'a (dyn Any + Send + Sync),
    &'a Ctx,
    Value,
) -> BoxFuture<'a, Result<Value, DispatchError>>;

/// How a tool is called.
#[derive(Clone, Copy)]
pub enum Call {
    /// A free function.
    Free(FreeCall),
    /// A method of the type whose `TypeId` `self_type` gives.
    Method {
        /// `TypeId::of::<Self>`.
        self_type: fn() -> TypeId,
        /// The type's name, for messages.
        type_name: &'static str,
        /// The dispatcher.
        call: MethodCall,
    },
}

/// A tool's dispatcher, as `#[tool]` registers it.
pub struct Dispatcher {
    /// The tool's name (as in its descriptor).
    pub name: &'static str,
    /// Its doc comment, as written (one line per `///`).
    pub doc: &'static str,
    /// `destructive = ...` when the tool gives it.
    pub destructive: Option<bool>,
    /// The JSON schema of its arguments.
    pub schema: fn() -> Value,
    /// `Ok` when its types allow a call with JSON, else why not.
    pub available: fn() -> Result<(), String>,
    /// The call.
    pub call: Call,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The registration of a [`Dispatcher`].
pub struct RegisteredDispatch(pub &'static Dispatcher);

inventory::collect!(RegisteredDispatch);

pub(crate) fn registered() -> impl Iterator<Item = &'static Dispatcher> {
    inventory::iter::<RegisteredDispatch>
        .into_iter()
        .map(|r| r.0)
}

/// A value of any type, for the type-only code of availability checks,
/// which is compiled but never run.
pub fn never<T>() -> T {
    unreachable!("idem: type-level placeholder evaluated")
}

/// A dispatcher's early error, as its future.
pub fn ready_err<'a>(e: DispatchError) -> BoxFuture<'a, Result<Value, DispatchError>> {
    Box::pin(std::future::ready(Err(e)))
}

/// The arguments of one call, read parameter by parameter.
#[derive(Debug)]
pub struct ArgsReader {
    tool: &'static str,
    map: Map<String, Value>,
}

impl ArgsReader {
    /// Checks that `args` is an object (or `null`, for no arguments) whose
    /// keys are all parameters of the tool.
    pub fn new(
        tool: &'static str,
        params: &'static [&'static str],
        args: Value,
    ) -> Result<ArgsReader, DispatchError> {
        let map = match args {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            other => {
                return Err(DispatchError::InvalidArguments {
                    tool: tool.into(),
                    argument: None,
                    detail: format!(
                        "the arguments must be a JSON object with the tool's parameters ({}), \
                         not {}",
                        param_list(params),
                        json_kind(&other)
                    ),
                })
            }
        };
        if let Some(unknown) = map.keys().find(|k| !params.contains(&k.as_str())) {
            return Err(DispatchError::InvalidArguments {
                tool: tool.into(),
                argument: Some(unknown.clone()),
                detail: format!(
                    "not a parameter of `{tool}`, which takes: {}",
                    param_list(params)
                ),
            });
        }
        Ok(ArgsReader { tool, map })
    }

    fn take<T: DeserializeOwned>(&mut self, name: &'static str) -> Result<T, DispatchError> {
        let invalid = |detail: String| DispatchError::InvalidArguments {
            tool: self.tool.into(),
            argument: Some(name.into()),
            detail,
        };
        match self.map.remove(name) {
            Some(value) => serde_json::from_value(value).map_err(|e| invalid(e.to_string())),
            // An absent argument is `null`: fine for an `Option`.
            None => serde_json::from_value(Value::Null)
                .map_err(|_| invalid("missing (it is required)".into())),
        }
    }
}

fn param_list(params: &[&str]) -> String {
    if params.is_empty() {
        "no parameters".into()
    } else {
        params.join(", ")
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `{"type": "object", "properties": ..., "required": [...]}` from each
/// parameter's name, schema and whether it may be left out.
pub fn args_schema(params: Vec<(&'static str, Value, bool)>) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for (name, schema, optional) in params {
        properties.insert(name.into(), schema);
        if !optional {
            required.push(Value::from(name));
        }
    }
    serde_json::json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// Turns a call's outcome into the dispatcher's.
pub fn outcome<T, E>(
    tool: &'static str,
    result: Result<T, ToolError<E>>,
    encode: fn(&T) -> Result<Value, String>,
    describe: fn(&E) -> String,
    classify: Option<fn(&E) -> Failure>,
) -> Result<Value, DispatchError> {
    match result {
        Ok(value) => encode(&value).map_err(|detail| DispatchError::Result {
            tool: tool.into(),
            detail,
        }),
        Err(e) => Err(DispatchError::from_tool_error(tool, e, describe, classify)),
    }
}

/// Probes a parameter type `T`.
pub struct ArgProbe<T: ?Sized>(PhantomData<fn() -> Box<T>>);

impl<T: ?Sized> ArgProbe<T> {
    /// A probe for `T`.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        ArgProbe(PhantomData)
    }
}

/// A parameter that decodes from JSON.
pub trait ArgDecode<T> {
    /// Reads the argument `name`.
    fn take(&self, args: &mut ArgsReader, name: &'static str) -> Result<T, DispatchError>;
    /// Whether the type can be decoded.
    fn check(&self, name: &'static str) -> Result<(), String>;
    /// Whether the argument may be left out (it decodes from `null`).
    fn optional(&self) -> bool;
}

impl<T: DeserializeOwned> ArgDecode<T> for &&ArgProbe<T> {
    fn take(&self, args: &mut ArgsReader, name: &'static str) -> Result<T, DispatchError> {
        args.take(name)
    }
    fn check(&self, _name: &'static str) -> Result<(), String> {
        Ok(())
    }
    fn optional(&self) -> bool {
        serde_json::from_value::<T>(Value::Null).is_ok()
    }
}

/// A parameter that does not.
pub trait ArgOpaque<T> {
    /// Refuses: the type cannot be decoded.
    fn take(&self, args: &mut ArgsReader, name: &'static str) -> Result<T, DispatchError>;
    /// Says why.
    fn check(&self, name: &'static str) -> Result<(), String>;
    /// Not meaningful; `false`.
    fn optional(&self) -> bool;
}

impl<T> ArgOpaque<T> for &ArgProbe<T> {
    fn take(&self, args: &mut ArgsReader, name: &'static str) -> Result<T, DispatchError> {
        Err(DispatchError::Unavailable {
            tool: args.tool.into(),
            reason: self.check(name).unwrap_err(),
        })
    }
    fn check(&self, name: &'static str) -> Result<(), String> {
        Err(format!(
            "parameter `{name}` is a `{}`, which is not `serde::Deserialize` (owned)",
            std::any::type_name::<T>()
        ))
    }
    fn optional(&self) -> bool {
        false
    }
}

/// The schema of a parameter type: [`ArgSchema`](super::ArgSchema) first,
/// then `schemars::JsonSchema` (feature `schemars`), else `{}`.
pub trait SchemaOwn {
    /// The schema.
    fn schema(&self) -> Value;
}

impl<T: super::ArgSchema + ?Sized> SchemaOwn for &&&ArgProbe<T> {
    fn schema(&self) -> Value {
        T::arg_schema()
    }
}

/// The schema from `schemars` (feature `schemars`).
pub trait SchemaSchemars {
    /// The schema.
    fn schema(&self) -> Value;
}

#[cfg(feature = "schemars")]
impl<T: schemars::JsonSchema + ?Sized> SchemaSchemars for &&ArgProbe<T> {
    fn schema(&self) -> Value {
        super::schemars_schema::<T>()
    }
}

/// No schema known: any JSON value.
pub trait SchemaAny {
    /// The empty schema.
    fn schema(&self) -> Value;
}

impl<T: ?Sized> SchemaAny for &ArgProbe<T> {
    fn schema(&self) -> Value {
        Value::Object(Map::new())
    }
}

/// Probes a result type.
pub struct ResultProbe<T: ?Sized>(PhantomData<fn() -> Box<T>>);

impl<T: ?Sized> ResultProbe<T> {
    /// A probe for `T`.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        ResultProbe(PhantomData)
    }
}

/// A result that encodes as JSON.
pub trait ResultJson<T> {
    /// The encoder.
    fn encoder(&self) -> fn(&T) -> Result<Value, String>;
    /// Whether it encodes.
    fn check(&self) -> Result<(), String>;
}

impl<T: Serialize> ResultJson<T> for &&ResultProbe<T> {
    fn encoder(&self) -> fn(&T) -> Result<Value, String> {
        |v| serde_json::to_value(v).map_err(|e| e.to_string())
    }
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// A result that does not.
pub trait ResultOpaque<T> {
    /// An encoder that refuses.
    fn encoder(&self) -> fn(&T) -> Result<Value, String>;
    /// Says why.
    fn check(&self) -> Result<(), String>;
}

impl<T> ResultOpaque<T> for &ResultProbe<T> {
    fn encoder(&self) -> fn(&T) -> Result<Value, String> {
        |_| {
            Err(format!(
                "`{}` is not `Serialize`",
                std::any::type_name::<T>()
            ))
        }
    }
    fn check(&self) -> Result<(), String> {
        Err(format!(
            "its result, a `{}`, is not `serde::Serialize`",
            std::any::type_name::<T>()
        ))
    }
}

/// The error's classification, when the type has one (it always does in a
/// tool that compiles; the probe keeps a broken tool's errors to its own).
pub struct ClassifyProbe<E>(PhantomData<fn() -> E>);

impl<E> ClassifyProbe<E> {
    /// A probe for `E`.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        ClassifyProbe(PhantomData)
    }
}

/// `E: Classify`.
pub trait Classified<E> {
    /// `Some(classify)`.
    fn classifier(&self) -> Option<fn(&E) -> Failure>;
}

impl<E: Classify> Classified<E> for &&ClassifyProbe<E> {
    fn classifier(&self) -> Option<fn(&E) -> Failure> {
        Some(|e| e.classify())
    }
}

/// `E` without `Classify`.
pub trait Unclassified<E> {
    /// `None`.
    fn classifier(&self) -> Option<fn(&E) -> Failure>;
}

impl<E> Unclassified<E> for &ClassifyProbe<E> {
    fn classifier(&self) -> Option<fn(&E) -> Failure> {
        None
    }
}

/// Holds a tool's future (or, for availability checks, only its type).
pub struct SendProbe<F>(Cell<Option<F>>);

impl<F> SendProbe<F> {
    /// The future of a call.
    pub fn new(future: F) -> Self {
        SendProbe(Cell::new(Some(future)))
    }

    /// Only the type of the future `make` would return; `make` is not
    /// called.
    pub fn of<C: FnOnce() -> F>(_make: &C) -> Self {
        SendProbe(Cell::new(None))
    }
}

/// A future that can be boxed as `Send`.
pub trait FutureSend<'a> {
    /// What the future returns.
    type Out;
    /// The future, boxed, its output converted by `convert`.
    fn boxed<C>(&self, convert: C) -> BoxFuture<'a, Result<Value, DispatchError>>
    where
        C: FnOnce(Self::Out) -> Result<Value, DispatchError> + Send + 'a;
    /// `Ok`.
    fn check(&self) -> Result<(), String>;
}

impl<'a, F: Future + Send + 'a> FutureSend<'a> for &&SendProbe<F> {
    type Out = F::Output;
    fn boxed<C>(&self, convert: C) -> BoxFuture<'a, Result<Value, DispatchError>>
    where
        C: FnOnce(Self::Out) -> Result<Value, DispatchError> + Send + 'a,
    {
        match self.0.take() {
            Some(future) => Box::pin(async move { convert(future.await) }),
            None => ready_err(DispatchError::Unavailable {
                tool: String::new(),
                reason: "no call to make".into(),
            }),
        }
    }
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// A future that is not `Send`.
pub trait FutureLocal<'a> {
    /// What the future returns.
    type Out;
    /// Refuses.
    fn boxed<C>(&self, convert: C) -> BoxFuture<'a, Result<Value, DispatchError>>
    where
        C: FnOnce(Self::Out) -> Result<Value, DispatchError> + Send + 'a;
    /// Says why.
    fn check(&self) -> Result<(), String>;
}

impl<'a, F: Future> FutureLocal<'a> for &SendProbe<F> {
    type Out = F::Output;
    fn boxed<C>(&self, _convert: C) -> BoxFuture<'a, Result<Value, DispatchError>>
    where
        C: FnOnce(Self::Out) -> Result<Value, DispatchError> + Send + 'a,
    {
        ready_err(DispatchError::Unavailable {
            tool: String::new(),
            reason: self.check().unwrap_err(),
        })
    }
    fn check(&self) -> Result<(), String> {
        Err(
            "its future is not `Send` (it holds something that is not `Send`, such as an \
             `Rc` or a `std::sync::MutexGuard`, across an `.await`)"
                .into(),
        )
    }
}

/// `dispatch = true`: a parameter that must decode from JSON.
#[diagnostic::on_unimplemented(
    message = "`dispatch = true`: tool parameter of type `{Self}` cannot be decoded from JSON",
    label = "not `serde::Deserialize` (owned)",
    note = "derive `serde::Deserialize` for it, or remove `dispatch = true` (the tool then has no JSON dispatcher), or take the value in another form"
)]
pub trait DispatchArg: DeserializeOwned {}
impl<T: DeserializeOwned> DispatchArg for T {}

/// Spans a parameter that `dispatch = true` cannot decode on its type.
pub fn assert_dispatch_arg<T: DispatchArg>() {}

/// `dispatch = true`: a result that must encode as JSON.
#[diagnostic::on_unimplemented(
    message = "`dispatch = true`: tool result of type `{Self}` cannot be encoded as JSON",
    label = "not `serde::Serialize`",
    note = "derive `serde::Serialize` for it, or remove `dispatch = true`"
)]
pub trait DispatchResult: Serialize {}
impl<T: Serialize> DispatchResult for T {}

/// Spans a result that `dispatch = true` cannot encode on its type.
pub fn assert_dispatch_result<T: DispatchResult>() {}

/// `dispatch = true`: the tool's future must be `Send`.
pub fn assert_dispatch_send<F: Send, C: FnOnce() -> F>(_make: &C) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::needless_borrow)] // the borrows are what picks the impl
    fn the_probes_tell_what_json_can_carry() {
        #[allow(unused_imports)]
        use super::{ArgDecode as _, ArgOpaque as _, SchemaAny as _, SchemaOwn as _};
        #[allow(unused_imports)]
        use super::{ResultJson as _, ResultOpaque as _, SchemaSchemars as _};
        struct Opaque;
        assert!((&&&ArgProbe::<u64>::new()).check("n").is_ok());
        assert!(!(&&&ArgProbe::<u64>::new()).optional());
        assert!((&&&ArgProbe::<Option<u64>>::new()).optional());
        let err = (&&&ArgProbe::<Opaque>::new()).check("o").unwrap_err();
        assert!(
            err.contains("parameter `o`") && err.contains("Opaque"),
            "{err}"
        );
        assert_eq!((&&&&ArgProbe::<u8>::new()).schema()["maximum"], 255);
        assert_eq!(
            (&&&&ArgProbe::<Opaque>::new()).schema(),
            serde_json::json!({})
        );
        assert!((&&&ResultProbe::<String>::new()).check().is_ok());
        assert!((&&&ResultProbe::<Opaque>::new()).check().is_err());
    }

    #[test]
    fn arguments_are_checked_by_name() {
        static PARAMS: &[&str] = &["to", "note"];
        let err = ArgsReader::new("mail", PARAMS, serde_json::json!({"too": 1})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid arguments for `mail`: argument `too`: not a parameter of `mail`, which \
             takes: to, note"
        );
        let err = ArgsReader::new("mail", PARAMS, serde_json::json!([1])).unwrap_err();
        assert!(err.to_string().contains("not an array"), "{err}");
        let mut r = ArgsReader::new("mail", PARAMS, serde_json::json!({"to": 5})).unwrap();
        let err = r.take::<String>("to").unwrap_err();
        assert!(
            err.to_string()
                .contains("argument `to`: invalid type: integer `5`, expected a string"),
            "{err}"
        );
        assert_eq!(r.take::<Option<String>>("note").unwrap(), None);
        let mut r = ArgsReader::new("mail", PARAMS, Value::Null).unwrap();
        let err = r.take::<String>("to").unwrap_err();
        assert!(err
            .to_string()
            .ends_with("argument `to`: missing (it is required)"));
    }
}
