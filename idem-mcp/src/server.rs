//! [`McpServer`]: a [`ToolSet`] served as an MCP server.

use std::collections::BTreeMap;
use std::sync::Arc;

use idem_runtime::{CallReport, Class, DispatchError, Runtime, ToolSchema, ToolSet};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, CustomRequest,
    CustomResult, ErrorCode, Implementation, ListToolsResult, MetaObject, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Map, Value};

use crate::identity::{self, CallInfo, Decision, IdentityError, Resolver};
use crate::stdio::{Guarded, MAX_MESSAGE_BYTES, OVERSIZED_METHOD};
use crate::Error;

/// Serves a set of tools over MCP: `tools/list` from their schemas and
/// classes, `tools/call` through the engine under the call's run identity.
///
/// Cheap to clone (the streamable HTTP transport makes one per session).
#[derive(Clone)]
pub struct McpServer {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    rt: Runtime,
    tools: Arc<dyn ToolSet>,
    /// MCP name → idem name (`Type::method` is `Type.method` in MCP).
    names: BTreeMap<String, &'static str>,
    listed: Vec<Tool>,
    resolver: Option<Arc<Resolver>>,
    info: Implementation,
    instructions: Option<String>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("tools", &self.inner.names.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// A tool's name as MCP clients see it: MCP names are letters, digits,
/// `_`, `-` and `.`, so a method tool's `Type::method` is `Type.method`
/// (as [`ToolSchema::mcp_name`] says).
pub fn mcp_name(name: &str) -> String {
    name.replace("::", ".")
}

/// MCP's hints from a tool's class: `read_only` reads only; every other
/// class is idempotent (the same call in the same run is deduplicated) and
/// destructive unless the tool says `destructive = false`.
pub fn annotations(schema: &ToolSchema) -> ToolAnnotations {
    let read_only = schema.class == Class::ReadOnly;
    ToolAnnotations::new()
        .read_only(read_only)
        .destructive(!read_only && schema.destructive)
        .idempotent(schema.idempotent())
        .open_world(true)
}

/// Where a tool is defined: `module (file:line)`.
fn defined_at(schema: &ToolSchema) -> String {
    let d = schema.descriptor;
    format!("{} ({}:{})", d.module_path, d.file, d.line)
}

fn listed(schema: &ToolSchema) -> Tool {
    let input = match &schema.input_schema {
        Value::Object(map) => map.clone(),
        // A custom `schema = ...` that is not an object: MCP requires one.
        other => {
            let mut map = Map::new();
            map.insert("type".into(), "object".into());
            map.insert("description".into(), other.to_string().into());
            map
        }
    };
    let mut tool = Tool::new_with_raw(
        mcp_name(schema.name),
        (!schema.description.is_empty()).then(|| schema.description.clone().into()),
        Arc::new(input),
    )
    .with_annotations(annotations(schema));
    let mut meta = MetaObject::new();
    meta.insert("idem/class".into(), schema.class.as_str().into());
    tool = tool.with_meta(meta);
    tool
}

impl McpServer {
    /// Serves `tools` on the journal of `rt`.
    ///
    /// Refuses a set in which two tools have the same MCP name (a free
    /// tool named `Mailer.send` next to the method tool `Mailer::send`, or
    /// a custom [`ToolSet`] listing one name twice) with
    /// [`DispatchError::NameCollision`] naming both: a client could not
    /// tell them apart, and every call would go to one of them.
    pub fn new(rt: Runtime, tools: impl ToolSet + 'static) -> Result<McpServer, DispatchError> {
        let schemas = tools.schemas();
        let mut by_mcp: BTreeMap<String, &ToolSchema> = BTreeMap::new();
        for schema in &schemas {
            let name = mcp_name(schema.name);
            if let Some(first) = by_mcp.get(&name) {
                return Err(DispatchError::NameCollision {
                    mcp_name: name,
                    first: first.name.to_string(),
                    first_at: defined_at(first),
                    second: schema.name.to_string(),
                    second_at: defined_at(schema),
                });
            }
            by_mcp.insert(name, schema);
        }
        let names = by_mcp.into_iter().map(|(m, s)| (m, s.name)).collect();
        let listed = schemas.iter().map(listed).collect();
        Ok(McpServer {
            inner: Arc::new(Inner {
                rt,
                tools: Arc::new(tools),
                names,
                listed,
                resolver: None,
                info: Implementation::new("idem", env!("CARGO_PKG_VERSION")),
                instructions: None,
            }),
        })
    }

    /// This server's settings, copied first if a clone shares them (the
    /// clone keeps the old ones).
    fn inner_mut(&mut self) -> &mut Inner {
        Arc::make_mut(&mut self.inner)
    }

    /// Decides the run identity of every call: the resolver sees the
    /// tool, its arguments, the identity the client asked for in `_meta`
    /// ([`CallInfo::requested`]) and, over HTTP, the request's head, and
    /// accepts the requested identity, replaces it or refuses the call
    /// ([`Decision`]). With a resolver, `_meta` alone never names the run:
    /// `_meta` is the client's word, and no boundary between the parties a
    /// server serves.
    ///
    /// A resolver may return a [`Decision`], or an `Option<RunIdentity>`
    /// as resolvers did when they were asked only about calls without
    /// `_meta`: `Some` replaces, `None` refuses (also a call whose `_meta`
    /// names a run: return `call.requested.cloned()` to take it).
    ///
    /// ```no_run
    /// # use idem_mcp as mcp;
    /// use mcp::{Decision, McpServer, RunIdentity};
    /// # fn demo(server: McpServer) -> McpServer {
    /// // One journal, several tenants: the tenant comes from a header set
    /// // by the authenticating proxy in front, never from the client; the
    /// // client's run id is kept apart per tenant.
    /// server.with_resolver(|call| {
    ///     let tenant = call.http.and_then(|h| h.headers.get("x-tenant")?.to_str().ok());
    ///     let (Some(tenant), Some(asked)) = (tenant, call.requested) else {
    ///         return Decision::Refuse("no tenant or no run id".into());
    ///     };
    ///     let mut id = RunIdentity::new(tenant).scope(&asked.run);
    ///     id.scope.extend(asked.scope.iter().cloned());
    ///     Decision::Replace(id)
    /// })
    /// # }
    /// ```
    pub fn with_resolver<D: Into<Decision>>(
        mut self,
        resolver: impl Fn(&CallInfo<'_>) -> D + Send + Sync + 'static,
    ) -> McpServer {
        let resolver: Arc<Resolver> = Arc::new(move |call: &CallInfo<'_>| resolver(call).into());
        self.inner_mut().resolver = Some(resolver);
        self
    }

    /// The name and version this server gives in the MCP handshake
    /// (default `idem` and idem's version).
    pub fn with_server_info(mut self, name: &str, version: &str) -> McpServer {
        self.inner_mut().info = Implementation::new(name, version);
        self
    }

    /// Instructions for the client's model, sent in the handshake.
    pub fn with_instructions(mut self, text: impl Into<String>) -> McpServer {
        self.inner_mut().instructions = Some(text.into());
        self
    }

    /// The tools as `tools/list` describes them.
    pub fn tools(&self) -> &[Tool] {
        &self.inner.listed
    }

    /// Serves one client over this process's stdin and stdout until it
    /// closes them.
    pub async fn serve_stdio(self) -> Result<(), Error> {
        self.serve(rmcp::transport::stdio()).await
    }

    /// Serves one client over a byte stream (a socket, a pipe, one end of
    /// `tokio::io::duplex`) until it closes.
    ///
    /// One JSON-RPC message per line, each at most [`MAX_MESSAGE_BYTES`]
    /// (its line end included). A longer request is not read: it is
    /// answered with the reason (a `tools/call` with an `isError` result,
    /// `too_large`; another method with JSON-RPC's `-32600`), and the
    /// connection goes on.
    pub async fn serve<R, W>(self, io: (R, W)) -> Result<(), Error>
    where
        R: tokio::io::AsyncRead + Send + Unpin + 'static,
        W: tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let (read, write) = io;
        // rmcp's reader drops a line over its limit without an answer;
        // ours hands it only lines within the limit (and a stand-in for
        // each longer one), so rmcp's limit, kept as a backstop, is never
        // the one that acts.
        let transport = rmcp::transport::async_rw::AsyncRwTransport::new_server(
            Guarded::new(read, MAX_MESSAGE_BYTES),
            write,
        )
        .with_max_line_length(MAX_MESSAGE_BYTES + 2);
        let running = ServiceExt::serve(self, transport)
            .await
            .map_err(|e| Error::Handshake(e.to_string()))?;
        running
            .waiting()
            .await
            .map_err(|e| Error::Transport(e.to_string()))?;
        Ok(())
    }

    /// The call: identity, dispatch, and the MCP result of either.
    async fn call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let inner = &self.inner;
        let Some(&tool) = inner.names.get(request.name.as_ref()) else {
            // A result the model can read and act on, not a protocol
            // error: it names the tools there are.
            return Ok(failure(&DispatchError::UnknownTool {
                name: request.name.to_string(),
                known: inner.names.keys().cloned().collect(),
            }));
        };
        let arguments = request.arguments.unwrap_or_default();
        // rmcp moves the request's `_meta` into the context; a params
        // `_meta` left in place is read too.
        let mut meta: Map<String, Value> = context.meta.0 .0.clone();
        if let Some(m) = &request.meta {
            for (k, v) in m.iter() {
                meta.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        let identity = identity::requested(tool, &meta).and_then(|requested| {
            let info = CallInfo {
                tool,
                arguments: &arguments,
                meta: &meta,
                requested: requested.as_ref(),
                http: context.extensions.get::<http::request::Parts>(),
            };
            identity::decide(&info, inner.resolver.as_deref())
        });
        let identity = match identity {
            Ok(id) => id,
            Err(e) => return Ok(identity_refusal(&e)),
        };
        let mut ctx = inner.rt.run(&identity.run);
        for s in &identity.scope {
            ctx = ctx.scope(s);
        }
        tracing::debug!(tool, run = %identity.run, "idem mcp call");
        let (out, report) =
            idem_runtime::reporting(inner.tools.dispatch(&ctx, tool, Value::Object(arguments)))
                .await;
        let mut result = match out {
            Ok(value) => success(value),
            Err(e) => failure(&e),
        };
        result.meta = Some(report_meta(&report));
        Ok(result)
    }
}

/// What the engine said about a dispatched call, as the result's `_meta`:
/// `"idem/replayed"` always, `"idem/drift"` (the argument names) when the
/// arguments differ from those the operation was recorded with.
fn report_meta(report: &CallReport) -> MetaObject {
    let mut meta = MetaObject::new();
    meta.insert("idem/replayed".into(), report.replayed.into());
    if !report.drift.is_empty() {
        meta.insert("idem/drift".into(), report.drift.clone().into());
    }
    meta
}

/// A tool's result: its JSON as structured content (wrapped as
/// `{"result": ...}` when it is not an object, which MCP requires) and as
/// text.
fn success(value: Value) -> CallToolResult {
    let structured = match value {
        Value::Object(_) => value,
        other => json!({ "result": other }),
    };
    CallToolResult::structured(structured)
}

/// An idem error as an MCP error result: what happened and what the caller
/// may do, as structured content and as text.
fn failure(e: &DispatchError) -> CallToolResult {
    let mut result = CallToolResult::structured_error(e.to_json());
    result.content = vec![ContentBlock::text(format!("{e}\n{}", e.advice()))];
    result
}

/// A refusal before any tool ran, as an `isError` result.
fn refusal(structured: Value) -> CallToolResult {
    let text = structured["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut result = CallToolResult::structured_error(structured);
    result.content = vec![ContentBlock::text(text)];
    result
}

/// What a JSON value is, for a message: `an array`, `a string`, ...
fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A `tools/call` whose params rmcp could not read (it passes those on as
/// a custom request, answered by default with "method not found"): why,
/// as an `isError` result.
fn malformed_call(params: Option<&Value>) -> CallToolResult {
    let tool = params
        .and_then(|p| p.get("name"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let why = match params {
        None => {
            "a tools/call needs params: {\"name\": \"<tool>\", \"arguments\": {...}}".to_string()
        }
        Some(Value::Object(p)) => match (p.get("name"), p.get("arguments")) {
            (_, Some(a)) if !a.is_object() && !a.is_null() => format!(
                "`arguments` must be a JSON object of the tool's parameters, not {}",
                kind_of(a)
            ),
            (Some(Value::String(_)), _) => {
                match serde_json::from_value::<CallToolRequestParams>(Value::Object(p.clone())) {
                    Err(e) => format!("the params do not fit a tools/call: {e}"),
                    Ok(_) => "the params do not fit a tools/call".to_string(),
                }
            }
            (name, _) => format!(
                "`name` must be the tool's name, a string, not {}",
                name.map_or("missing", kind_of)
            ),
        },
        Some(other) => format!("the params must be an object, not {}", kind_of(other)),
    };
    let message = match &tool {
        Some(t) => format!("invalid call of `{t}`: {why}; nothing was run"),
        None => format!("invalid tools/call: {why}; nothing was run"),
    };
    let mut structured = json!({
        "error": "invalid_arguments",
        "message": message,
        "advice": "Send `arguments` as a JSON object with one entry per parameter, as the tool's input schema says; nothing was run.",
        "retryable": false,
    });
    if let Some(t) = tool {
        structured["tool"] = t.into();
    }
    refusal(structured)
}

/// The answer to a request too large to read (the stand-in
/// [`Guarded`] made for it).
fn too_large(params: Option<&Value>) -> Result<CustomResult, ErrorData> {
    let field = |k: &str| {
        params
            .and_then(|p| p.get(k))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let (method, bytes, limit) = (field("method"), field("bytes"), field("limit"));
    let message = format!(
        "the request is {bytes} bytes, more than the {limit} bytes this server reads in one \
         message: it was not read, and nothing was run"
    );
    if method == "tools/call" {
        let result = refusal(json!({
            "error": "too_large",
            "message": message,
            "advice": "Send smaller arguments (large content by reference: a URL, a path or an id the tool can fetch); nothing was run.",
            "retryable": false,
            "bytes": bytes,
            "limit": limit,
        }));
        let value = serde_json::to_value(result)
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        return Ok(CustomResult(value));
    }
    Err(ErrorData::new(
        ErrorCode::INVALID_REQUEST,
        message,
        Some(json!({ "error": "too_large", "method": method, "bytes": bytes, "limit": limit })),
    ))
}

fn identity_refusal(e: &IdentityError) -> CallToolResult {
    let structured = json!({
        "error": e.kind(),
        "message": e.to_string(),
        "advice": e.advice(),
        "retryable": false,
    });
    let mut result = CallToolResult::structured_error(structured);
    result.content = vec![ContentBlock::text(e.to_string())];
    result
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let mut config = ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(self.inner.info.clone());
        if let Some(text) = &self.inner.instructions {
            config = config.with_instructions(text.clone());
        }
        config
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.inner.listed.clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.inner
            .listed
            .iter()
            .find(|t| t.name.as_ref() == name)
            .cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.call(request, context).await.map(Into::into)
    }

    /// Requests rmcp does not know: a `tools/call` whose params it could
    /// not read, and the stand-in for a request too large to read; both
    /// are answered with why. Anything else is "method not found".
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        match request.method.as_str() {
            "tools/call" => {
                let result = malformed_call(request.params.as_ref());
                serde_json::to_value(result)
                    .map(CustomResult)
                    .map_err(|e| ErrorData::internal_error(e.to_string(), None))
            }
            OVERSIZED_METHOD => too_large(request.params.as_ref()),
            other => Err(ErrorData::new(
                ErrorCode::METHOD_NOT_FOUND,
                format!("method not found: {other}"),
                None,
            )),
        }
    }
}
