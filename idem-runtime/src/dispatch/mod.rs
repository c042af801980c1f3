//! Tools called by name with JSON arguments: what an LLM's function calls
//! and an MCP server need.
//!
//! `#[tool]` generates, next to each tool, a dispatcher (JSON arguments in,
//! JSON result out, the call itself through the engine as always) and the
//! JSON schema of its arguments. Free functions are reached through
//! [`tool_schemas`] and [`dispatch`]; a type's `#[tool]` methods, which need
//! the instance, through a [`Toolbox`]. Whether a tool gets a dispatcher is
//! decided by its types (see the `#[tool]` documentation, "JSON dispatch").

mod error;
pub(crate) mod generated;
pub(crate) mod report;
mod schema;

use std::any::{Any, TypeId};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use serde_json::{json, Value};

use crate::class::{tools, ToolDescriptor};
use crate::ctx::Ctx;
use idem_journal::class::Class;

pub use error::DispatchError;
use generated::{Call, Dispatcher};
pub use report::{reporting, CallReport, Dispatched};
pub use schema::ArgSchema;

/// A boxed, `Send` future: what dispatchers return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a model or an MCP client is told about one tool.
#[derive(Debug, Clone)]
pub struct ToolSchema {
    /// The tool's name (its `name`, or the default).
    pub name: &'static str,
    /// Its doc comment, without the `///` and one leading space per line.
    pub description: String,
    /// The JSON schema of its arguments: an object with one property per
    /// parameter after the context.
    pub input_schema: Value,
    /// Its class.
    pub class: Class,
    /// Whether it may destroy or overwrite something (MCP's
    /// `destructiveHint`): `false` for read-only tools, else `true` unless
    /// the tool says `destructive = false`.
    pub destructive: bool,
    /// Everything else idem knows about it.
    pub descriptor: &'static ToolDescriptor,
}

impl ToolSchema {
    /// Whether calling it twice with the same arguments (in one run and
    /// scope) has the effect of calling it once: true of every class —
    /// `read_only` changes nothing, the others are deduplicated.
    pub fn idempotent(&self) -> bool {
        true
    }

    /// The name MCP clients see: MCP names are letters, digits, `_`, `-`
    /// and `.`, so a method tool's `Type::method` is `Type.method`. Two
    /// tools of one [`Toolbox`] never share it (see
    /// [`DispatchError::NameCollision`]).
    pub fn mcp_name(&self) -> String {
        mcp_name(self.name)
    }

    /// The schema as JSON: `name`, `description`, `input_schema`, `class`,
    /// `destructive`.
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            "class": self.class.as_str(),
            "destructive": self.destructive,
        })
    }
}

/// Tools that can be listed and called by name with JSON arguments: a
/// [`Toolbox`], or your own set (to filter, rename or add tools).
pub trait ToolSet: Send + Sync {
    /// The tools, sorted by name.
    fn schemas(&self) -> Vec<ToolSchema>;

    /// Calls tool `name` with `args` (a JSON object of its parameters)
    /// under `ctx`, through the engine: replayed, retried or escalated by
    /// its class's rules, exactly as a direct call.
    fn dispatch<'a>(
        &'a self,
        ctx: &'a Ctx,
        name: &'a str,
        args: Value,
    ) -> BoxFuture<'a, Result<Value, DispatchError>>;

    /// [`ToolSet::dispatch`], with whether the result was replayed and
    /// which arguments drifted from those recorded ([`Dispatched`]).
    fn dispatch_reported<'a>(
        &'a self,
        ctx: &'a Ctx,
        name: &'a str,
        args: Value,
    ) -> BoxFuture<'a, Result<Dispatched, DispatchError>> {
        Box::pin(async move {
            let (out, report) = reporting(self.dispatch(ctx, name, args)).await;
            out.map(|value| Dispatched::new(value, report))
        })
    }
}

impl<T: ToolSet + ?Sized> ToolSet for Arc<T> {
    fn schemas(&self) -> Vec<ToolSchema> {
        (**self).schemas()
    }

    fn dispatch<'a>(
        &'a self,
        ctx: &'a Ctx,
        name: &'a str,
        args: Value,
    ) -> BoxFuture<'a, Result<Value, DispatchError>> {
        (**self).dispatch(ctx, name, args)
    }
}

/// The dispatchable tools of this binary, by name, with their descriptors;
/// and those whose types do not allow JSON, with the reason.
struct Registry {
    by_name: BTreeMap<&'static str, (&'static Dispatcher, &'static ToolDescriptor)>,
    unavailable: BTreeMap<&'static str, String>,
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let descriptors: BTreeMap<&str, &'static ToolDescriptor> =
            tools().map(|t| (t.name, t)).collect();
        let mut registry = Registry {
            by_name: BTreeMap::new(),
            unavailable: BTreeMap::new(),
        };
        for d in generated::registered() {
            let Some(t) = descriptors.get(d.name) else {
                continue;
            };
            match (d.available)() {
                Ok(()) => {
                    registry.by_name.insert(d.name, (d, *t));
                }
                Err(reason) => {
                    registry.unavailable.insert(d.name, reason);
                }
            }
        }
        registry
    })
}

/// Why `name` is not a free-function tool that [`dispatch`] can call.
fn not_free(name: &str) -> DispatchError {
    let r = registry();
    if let Some(reason) = r.unavailable.get(name) {
        return DispatchError::Unavailable {
            tool: name.into(),
            reason: reason.clone(),
        };
    }
    if let Some((
        Dispatcher {
            call: Call::Method { type_name, .. },
            ..
        },
        _,
    )) = r.by_name.get(name)
    {
        return DispatchError::Unavailable {
            tool: name.into(),
            reason: format!(
                "it is a method of `{type_name}`: call it through a Toolbox holding the instance \
                 (Toolbox::new().with_methods(..))"
            ),
        };
    }
    unknown(name, tool_schemas().iter().map(|s| s.name))
}

fn schema_of(d: &Dispatcher, t: &'static ToolDescriptor) -> ToolSchema {
    ToolSchema {
        name: d.name,
        description: description(d.doc),
        input_schema: (d.schema)(),
        class: t.class,
        destructive: t.class != Class::ReadOnly && d.destructive.unwrap_or(true),
        descriptor: t,
    }
}

/// `Type::method` as MCP names it: `Type.method`.
fn mcp_name(name: &str) -> String {
    name.replace("::", ".")
}

/// Where a tool is defined: `module (file:line)`.
fn defined_at(t: &ToolDescriptor) -> String {
    format!("{} ({}:{})", t.module_path, t.file, t.line)
}

/// A doc comment as written (`/// text` is `" text"`) made plain.
fn description(doc: &str) -> String {
    let lines: Vec<&str> = doc
        .lines()
        .map(|l| l.strip_prefix(' ').unwrap_or(l).trim_end())
        .collect();
    lines.join("\n").trim().to_string()
}

fn is_free(d: &Dispatcher) -> bool {
    matches!(d.call, Call::Free(_))
}

/// Every free-function tool of this binary that can be called with JSON
/// (see [`dispatch`]), sorted by name: name, description (the doc
/// comment), the JSON schema of its arguments, class. Method tools are
/// listed by a [`Toolbox`] holding their instance.
pub fn tool_schemas() -> Vec<ToolSchema> {
    registry()
        .by_name
        .values()
        .filter(|(d, _)| is_free(d))
        .map(|(d, t)| schema_of(d, t))
        .collect()
}

/// Calls the free-function tool `name` with JSON arguments under `ctx`,
/// through the engine (replayed, retried or escalated by its class's
/// rules, exactly as a direct call), and returns its result as JSON.
///
/// `args` is an object with one entry per parameter after the context
/// (`null` for none); an entry may be left out when its type decodes from
/// `null` (an `Option`). An unknown tool, an unknown or missing argument,
/// or a value that does not decode is an error naming it, and nothing is
/// run; so is a tool whose types do not allow JSON
/// ([`DispatchError::Unavailable`], with the reason). Method tools are
/// called through a [`Toolbox`].
pub async fn dispatch(ctx: &Ctx, name: &str, args: Value) -> Result<Value, DispatchError> {
    match registry().by_name.get(name) {
        Some((d, _)) if is_free(d) => call(d, None, ctx, args).await,
        _ => Err(not_free(name)),
    }
}

/// [`dispatch`], with whether the result was replayed and which arguments
/// drifted from those the operation was recorded with: a
/// [`Dispatched`] (`value` is what [`dispatch`] returns). A model can be
/// told that a call did nothing new, or that the arguments it sent were
/// not the ones that ran.
///
/// ```
/// use idem::{tool, Classify, Ctx, Failure, Runtime};
/// use serde_json::json;
///
/// #[derive(Debug)]
/// struct MailError;
/// impl Classify for MailError {
///     fn classify(&self) -> Failure {
///         Failure::Semantic
///     }
/// }
///
/// /// Sends a receipt, once per order.
/// #[tool(class = "provider", key = "order_id")]
/// async fn send_receipt(ctx: &Ctx, order_id: u64, note: String) -> Result<u64, MailError> {
///     Ok(order_id)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let rt = Runtime::open(dir.path())?;
/// let ctx = rt.run("order-9");
/// let first = idem::dispatch_reported(&ctx, "send_receipt", json!({ "order_id": 9, "note": "hi" })).await?;
/// assert!(!first.replayed);
/// let again = idem::dispatch_reported(&ctx, "send_receipt", json!({ "order_id": 9, "note": "hey" })).await?;
/// assert!(again.replayed);
/// assert_eq!(again.drift, ["note"]);
/// # Ok(())
/// # }
/// ```
pub async fn dispatch_reported(
    ctx: &Ctx,
    name: &str,
    args: Value,
) -> Result<Dispatched, DispatchError> {
    let (out, report) = reporting(dispatch(ctx, name, args)).await;
    out.map(|value| Dispatched::new(value, report))
}

fn unknown<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> DispatchError {
    DispatchError::UnknownTool {
        name: name.to_string(),
        known: known.map(str::to_string).collect(),
    }
}

fn call<'a>(
    d: &'static Dispatcher,
    instance: Option<&'a (dyn Any + Send + Sync)>,
    ctx: &'a Ctx,
    args: Value,
) -> BoxFuture<'a, Result<Value, DispatchError>> {
    match (d.call, instance) {
        (Call::Free(f), _) => f(ctx, args),
        (Call::Method { call, .. }, Some(this)) => call(this, ctx, args),
        (Call::Method { type_name, .. }, None) => {
            generated::ready_err(DispatchError::Unavailable {
                tool: d.name.into(),
                reason: format!("it is a method of `{type_name}`: call it through a Toolbox"),
            })
        }
    }
}

/// A set of tools to list and call by name: free functions, and the
/// `#[tool]` methods of instances you hand it.
///
/// Two tools whose names differ but read the same to an MCP client
/// (`Mailer::send` is `Mailer.send` there, see [`ToolSchema::mcp_name`])
/// are refused by [`Toolbox::with_function`] and [`Toolbox::with_methods`]
/// with [`DispatchError::NameCollision`], naming both: calls would all go
/// to one of them. ([`Toolbox::functions`] cannot fail; an MCP server
/// refuses a set that holds such a pair when it is made.)
///
/// ```
/// use std::sync::Arc;
/// use idem::{tool, Classify, Ctx, Failure, Runtime, ToolSet, Toolbox};
///
/// #[derive(Debug)]
/// struct ShopError;
/// impl Classify for ShopError {
///     fn classify(&self) -> Failure {
///         Failure::Semantic
///     }
/// }
///
/// struct Shop {
///     currency: String,
/// }
///
/// #[tool]
/// impl Shop {
///     /// Charges an order.
///     #[tool(class = "provider", key = "order_id")]
///     async fn charge(&self, ctx: &Ctx, order_id: u64, cents: u64) -> Result<String, ShopError> {
///         Ok(format!("{cents} {} for {order_id}", self.currency))
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let rt = Runtime::open(dir.path())?;
/// let tools = Toolbox::new().with_methods(Arc::new(Shop { currency: "EUR".into() }))?;
/// let schema = &tools.schemas()[0];
/// assert_eq!(schema.name, "Shop::charge");
/// assert_eq!(schema.description, "Charges an order.");
/// assert_eq!(schema.input_schema["required"], serde_json::json!(["order_id", "cents"]));
///
/// let ctx = rt.run("order-7");
/// let args = serde_json::json!({ "order_id": 7, "cents": 1999 });
/// let charged = tools.dispatch(&ctx, "Shop::charge", args).await?;
/// assert_eq!(charged, "1999 EUR for 7");
/// # Ok(())
/// # }
/// ```
#[derive(Default, Clone)]
pub struct Toolbox {
    entries: BTreeMap<&'static str, Entry>,
}

#[derive(Clone)]
struct Entry {
    dispatcher: &'static Dispatcher,
    descriptor: &'static ToolDescriptor,
    /// For a method: `Arc<Self>` as `dyn Any`.
    instance: Option<Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Toolbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Toolbox")
            .field("tools", &self.entries.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Toolbox {
    /// An empty toolbox.
    pub fn new() -> Toolbox {
        Toolbox::default()
    }

    /// Every free-function tool of this binary that can be called with
    /// JSON (those [`tool_schemas`] lists).
    pub fn functions() -> Toolbox {
        let mut toolbox = Toolbox::new();
        for (name, (d, t)) in &registry().by_name {
            if is_free(d) {
                toolbox.entries.insert(name, Entry::new(d, t, None));
            }
        }
        toolbox
    }

    /// Adds the free-function tool `name`.
    pub fn with_function(mut self, name: &str) -> Result<Toolbox, DispatchError> {
        match registry().by_name.get(name) {
            Some((d, t)) if is_free(d) => {
                self.insert(d.name, Entry::new(d, t, None))?;
                Ok(self)
            }
            _ => Err(not_free(name)),
        }
    }

    /// Adds every dispatchable `#[tool]` method of `T`, called on
    /// `instance`. The methods are those of `#[tool]` impl blocks of `T`
    /// (all of them, in any module); it is an error if there is none.
    pub fn with_methods<T: Any + Send + Sync>(
        mut self,
        instance: Arc<T>,
    ) -> Result<Toolbox, DispatchError> {
        let any: Arc<dyn Any + Send + Sync> = Arc::new(instance);
        let mut found = 0;
        for (name, (d, t)) in &registry().by_name {
            if let Call::Method { self_type, .. } = d.call {
                if self_type() == TypeId::of::<T>() {
                    self.insert(name, Entry::new(d, t, Some(any.clone())))?;
                    found += 1;
                }
            }
        }
        if found == 0 {
            return Err(DispatchError::Unavailable {
                tool: std::any::type_name::<T>().into(),
                reason: "the type has no #[tool] methods that take JSON: put #[idem::tool] on \
                         the impl block of its tool methods (they are registered by it)"
                    .into(),
            });
        }
        Ok(self)
    }

    /// Adds `entry` as `name`, unless another tool has its MCP name.
    /// (The same tool again replaces itself, as before.)
    fn insert(&mut self, name: &'static str, entry: Entry) -> Result<(), DispatchError> {
        let wanted = mcp_name(name);
        let clash = self
            .entries
            .iter()
            .find(|(other, _)| **other != name && mcp_name(other) == wanted);
        if let Some((other, there)) = clash {
            return Err(DispatchError::NameCollision {
                mcp_name: wanted,
                first: other.to_string(),
                first_at: defined_at(there.descriptor),
                second: name.to_string(),
                second_at: defined_at(entry.descriptor),
            });
        }
        self.entries.insert(name, entry);
        Ok(())
    }

    /// Leaves tool `name` out (to keep a tool from a model, say).
    pub fn without(mut self, name: &str) -> Toolbox {
        self.entries.remove(name);
        self
    }

    /// The names of the tools, sorted.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.entries.keys().copied()
    }
}

impl Entry {
    fn new(
        dispatcher: &'static Dispatcher,
        descriptor: &'static ToolDescriptor,
        instance: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Entry {
        Entry {
            dispatcher,
            descriptor,
            instance,
        }
    }
}

impl ToolSet for Toolbox {
    fn schemas(&self) -> Vec<ToolSchema> {
        self.entries
            .values()
            .map(|e| schema_of(e.dispatcher, e.descriptor))
            .collect()
    }

    fn dispatch<'a>(
        &'a self,
        ctx: &'a Ctx,
        name: &'a str,
        args: Value,
    ) -> BoxFuture<'a, Result<Value, DispatchError>> {
        match self.entries.get(name) {
            Some(e) => call(e.dispatcher, e.instance.as_deref(), ctx, args),
            None => generated::ready_err(unknown(name, self.names())),
        }
    }
}

/// A type's schema from schemars, inlined (no `$ref`s into a root that a
/// parameter's schema does not have).
#[cfg(feature = "schemars")]
fn schemars_schema<T: schemars::JsonSchema + ?Sized>() -> Value {
    let settings = schemars::generate::SchemaSettings::draft2020_12().with(|s| {
        s.inline_subschemas = true;
    });
    let mut schema = settings
        .into_generator()
        .into_root_schema_for::<T>()
        .to_value();
    if let Value::Object(map) = &mut schema {
        map.remove("$schema");
    }
    schema
}
