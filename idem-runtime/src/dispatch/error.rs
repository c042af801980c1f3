//! [`DispatchError`]: why a call by name with JSON arguments did not return
//! the tool's result, and what the caller may do about it.

use serde_json::{json, Value};

use crate::error::ToolError;
use crate::failure::Failure;
use idem_journal::error::Error;

/// Why [`dispatch`](crate::dispatch) (or a [`ToolSet`](crate::ToolSet))
/// did not return a tool's result.
///
/// The first three variants mean the tool was not called at all; the others
/// are the tool's [`ToolError`], named after the tool, with the tool's own
/// error reduced to its text and classification so that every tool's
/// errors have one type. [`DispatchError::kind`] is a stable label,
/// [`DispatchError::advice`] says what the caller may do, and
/// [`DispatchError::to_json`] puts both in the form an MCP client or a
/// model reads.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// No dispatchable tool has this name.
    #[error("no tool named `{name}`; the tools are: {}", list(known))]
    UnknownTool {
        /// The name asked for.
        name: String,
        /// The names that exist, sorted.
        known: Vec<String>,
    },
    /// The arguments do not fit the tool's parameters; the tool was not
    /// called.
    #[error("invalid arguments for `{tool}`: {}{detail}", argument.as_ref().map(|a| format!("argument `{a}`: ")).unwrap_or_default())]
    InvalidArguments {
        /// The tool.
        tool: String,
        /// The argument at fault, when one is.
        argument: Option<String>,
        /// What is wrong: serde's message for a value that does not decode.
        detail: String,
    },
    /// The tool exists but cannot be called with JSON (a parameter that is
    /// not `Deserialize`, a result that is not `Serialize`, a future that
    /// is not `Send`), or a [`Toolbox`](crate::Toolbox) was asked for tools
    /// that are not there.
    #[error("`{tool}` cannot be called with JSON arguments: {reason}")]
    Unavailable {
        /// The tool (or type).
        tool: String,
        /// Why.
        reason: String,
    },
    /// The tool ran and returned its own error ([`ToolError::Tool`]).
    #[error("`{tool}` failed ({}): {message}", failure.label())]
    Tool {
        /// The tool.
        tool: String,
        /// How the tool classified its error.
        failure: Failure,
        /// The error's `Display` (else `Debug`).
        message: String,
    },
    /// [`ToolError::Escalated`]: the outcome is unknown and waits for an
    /// operator.
    #[error("`{tool}`: operation {key} escalated: {reason}")]
    Escalated {
        /// The tool.
        tool: String,
        /// The operation's key.
        key: String,
        /// Why it was escalated.
        reason: String,
    },
    /// [`ToolError::InFlight`]: another call of the same operation is still
    /// being driven.
    #[error("`{tool}`: operation {key} is in flight in another call")]
    InFlight {
        /// The tool.
        tool: String,
        /// The operation's key.
        key: String,
    },
    /// [`ToolError::ArgsMismatch`]: the operation was first called with
    /// other arguments and the tool refuses drift.
    #[error("`{tool}`: operation {key} was first called with different arguments")]
    ArgsMismatch {
        /// The tool.
        tool: String,
        /// The operation's key.
        key: String,
    },
    /// [`ToolError::Abandoned`]: an operator abandoned the operation.
    #[error("`{tool}`: operation {key} was abandoned by an operator")]
    Abandoned {
        /// The tool.
        tool: String,
        /// The operation's key.
        key: String,
    },
    /// [`ToolError::AwaitingApproval`]: the call waits for a person's
    /// approval; nothing ran.
    #[error("`{tool}`: operation {key} awaits a person's approval; nothing ran yet")]
    AwaitingApproval {
        /// The tool.
        tool: String,
        /// The operation's key.
        key: String,
    },
    /// [`ToolError::NotApproved`]: a person refused the call.
    #[error("`{tool}`: operation {key} was not approved: {note}")]
    NotApproved {
        /// The tool.
        tool: String,
        /// The operation's key.
        key: String,
        /// The operator's note.
        note: String,
    },
    /// [`ToolError::Journal`]: the journal failed; the provider was not
    /// called after that was detected.
    #[error("`{tool}`: journal error: {error}")]
    Journal {
        /// The tool.
        tool: String,
        /// The journal's error.
        error: Error,
    },
    /// The tool succeeded but its result could not be turned into JSON.
    #[error("`{tool}` succeeded but its result is not JSON: {detail}")]
    Result {
        /// The tool.
        tool: String,
        /// serde_json's message.
        detail: String,
    },
    /// Two tools would have the same MCP name (a method tool `Type::method`
    /// is `Type.method` in MCP, so a tool named `Type.method` next to it
    /// could not be told apart): refused when a [`Toolbox`](crate::Toolbox)
    /// or an MCP server is put together, before anything is served.
    #[error(
        "two tools would both be listed as `{mcp_name}`: `{first}` ({first_at}) and `{second}` \
         ({second_at}); an MCP client could not tell them apart and every call would go to one \
         of them. Rename one (#[tool(name = \"...\")]) or leave one out"
    )]
    NameCollision {
        /// The shared MCP name.
        mcp_name: String,
        /// The tool already there (its idem name).
        first: String,
        /// Where it is defined: `module (file:line)`.
        first_at: String,
        /// The tool that collides with it.
        second: String,
        /// Where that one is defined.
        second_at: String,
    },
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "(none)".into()
    } else {
        names.join(", ")
    }
}

impl DispatchError {
    /// A stable label: `unknown_tool`, `invalid_arguments`, `unavailable`,
    /// `tool_error`, `escalated`, `in_flight`, `args_mismatch`,
    /// `abandoned`, `awaiting_approval`, `not_approved`, `journal`,
    /// `result`, `name_collision`.
    pub fn kind(&self) -> &'static str {
        match self {
            DispatchError::UnknownTool { .. } => "unknown_tool",
            DispatchError::InvalidArguments { .. } => "invalid_arguments",
            DispatchError::Unavailable { .. } => "unavailable",
            DispatchError::Tool { .. } => "tool_error",
            DispatchError::Escalated { .. } => "escalated",
            DispatchError::InFlight { .. } => "in_flight",
            DispatchError::ArgsMismatch { .. } => "args_mismatch",
            DispatchError::Abandoned { .. } => "abandoned",
            DispatchError::AwaitingApproval { .. } => "awaiting_approval",
            DispatchError::NotApproved { .. } => "not_approved",
            DispatchError::Journal { .. } => "journal",
            DispatchError::Result { .. } => "result",
            DispatchError::NameCollision { .. } => "name_collision",
        }
    }

    /// What the caller may do next, in a sentence a model can follow.
    pub fn advice(&self) -> &'static str {
        match self {
            DispatchError::UnknownTool { .. } => {
                "Call one of the listed tools; nothing was run."
            }
            DispatchError::InvalidArguments { .. } => {
                "Fix the arguments to match the tool's input schema and call again; nothing was run."
            }
            DispatchError::Unavailable { .. } => {
                "This tool cannot be called this way; nothing was run."
            }
            DispatchError::Tool { failure, .. } => match failure {
                Failure::Semantic => {
                    "The provider refused the request. Do not repeat it unchanged; a call with \
                     corrected arguments is a new decision."
                }
                Failure::NotSent { .. } => {
                    "The request never reached the provider. You may call again with the same \
                     arguments."
                }
                Failure::Ambiguous { .. } => {
                    "The outcome is unknown. Call again with the same arguments: idem will not \
                     repeat an effect that landed."
                }
            },
            DispatchError::Escalated { .. } => {
                "Wait for an operator to settle this operation; do not retry it with other \
                 arguments. Once settled, the same call returns its result."
            }
            DispatchError::InFlight { .. } => {
                "Retry later with the same arguments: another call of this operation is running."
            }
            DispatchError::ArgsMismatch { .. } => {
                "This operation was first called with other arguments: call again with the \
                 original arguments, or start a new scope for a different operation."
            }
            DispatchError::Abandoned { .. } => {
                "An operator abandoned this operation; it will not run under this run and scope. \
                 Start a new scope for a fresh attempt, if one is wanted."
            }
            DispatchError::AwaitingApproval { .. } => {
                "A person must approve this call before it runs; nothing ran. End your turn or \
                 do other work, then call this tool again with exactly the same arguments: it \
                 returns the decision once made (and runs the call if approved). Do not change \
                 the arguments: that would be a new request."
            }
            DispatchError::NotApproved { .. } => {
                "A person refused this call; it did not run and will not run. Read the note, \
                 and do not call it again with the same arguments."
            }
            DispatchError::Journal { .. } => {
                "The provider was not called. Retry later, or ask an operator to check the \
                 journal."
            }
            DispatchError::Result { .. } => {
                "The tool ran and succeeded; do not call it again. Its result could not be \
                 shown."
            }
            DispatchError::NameCollision { .. } => {
                "Two tools share a name as the caller sees it; give one another name. Nothing \
                 was run."
            }
        }
    }

    /// Whether calling again with the same arguments is what the advice
    /// says (`tool_error` that did not land, `in_flight`, `journal`,
    /// `awaiting_approval`).
    pub fn retryable(&self) -> bool {
        match self {
            DispatchError::Tool { failure, .. } => !matches!(failure, Failure::Semantic),
            DispatchError::InFlight { .. }
            | DispatchError::Journal { .. }
            | DispatchError::AwaitingApproval { .. } => true,
            _ => false,
        }
    }

    /// The tool concerned, when there is one.
    pub fn tool(&self) -> Option<&str> {
        match self {
            DispatchError::UnknownTool { .. } | DispatchError::NameCollision { .. } => None,
            DispatchError::InvalidArguments { tool, .. }
            | DispatchError::Unavailable { tool, .. }
            | DispatchError::Tool { tool, .. }
            | DispatchError::Escalated { tool, .. }
            | DispatchError::InFlight { tool, .. }
            | DispatchError::ArgsMismatch { tool, .. }
            | DispatchError::Abandoned { tool, .. }
            | DispatchError::AwaitingApproval { tool, .. }
            | DispatchError::NotApproved { tool, .. }
            | DispatchError::Journal { tool, .. }
            | DispatchError::Result { tool, .. } => Some(tool),
        }
    }

    /// The operation's key, for the variants that carry one.
    pub fn key(&self) -> Option<&str> {
        match self {
            DispatchError::Escalated { key, .. }
            | DispatchError::InFlight { key, .. }
            | DispatchError::ArgsMismatch { key, .. }
            | DispatchError::Abandoned { key, .. }
            | DispatchError::AwaitingApproval { key, .. }
            | DispatchError::NotApproved { key, .. } => Some(key),
            _ => None,
        }
    }

    /// The error as a JSON object: `error` ([`kind`](Self::kind)),
    /// `message` (the `Display` text), `advice`, `retryable`, and `tool`,
    /// `key`, `argument`, `failure` where they apply.
    pub fn to_json(&self) -> Value {
        let mut out = json!({
            "error": self.kind(),
            "message": self.to_string(),
            "advice": self.advice(),
            "retryable": self.retryable(),
        });
        let obj = out.as_object_mut().expect("an object");
        if let Some(tool) = self.tool() {
            obj.insert("tool".into(), tool.into());
        }
        if let Some(key) = self.key() {
            obj.insert("key".into(), key.into());
        }
        match self {
            DispatchError::InvalidArguments {
                argument: Some(a), ..
            } => {
                obj.insert("argument".into(), a.as_str().into());
            }
            DispatchError::Tool { failure, .. } => {
                obj.insert("failure".into(), failure.label().into());
            }
            DispatchError::NotApproved { note, .. } => {
                obj.insert("note".into(), note.as_str().into());
            }
            DispatchError::UnknownTool { known, .. } => {
                obj.insert("tools".into(), known.clone().into());
            }
            DispatchError::NameCollision {
                mcp_name,
                first,
                second,
                ..
            } => {
                obj.insert("mcp_name".into(), mcp_name.as_str().into());
                obj.insert("tools".into(), json!([first, second]));
            }
            _ => {}
        }
        out
    }

    /// A tool's [`ToolError`], with its own error described by `describe`
    /// and classified by `classify`.
    pub(crate) fn from_tool_error<E>(
        tool: &str,
        error: ToolError<E>,
        describe: fn(&E) -> String,
        classify: Option<fn(&E) -> Failure>,
    ) -> DispatchError {
        let tool = tool.to_string();
        match error {
            ToolError::Tool(e) => DispatchError::Tool {
                tool,
                // An error that cannot say is taken as possibly landed.
                failure: classify.map_or(Failure::ambiguous(), |c| c(&e)),
                message: describe(&e),
            },
            ToolError::Escalated { key, reason } => DispatchError::Escalated {
                tool,
                key: key.to_string(),
                reason,
            },
            ToolError::InFlight { key } => DispatchError::InFlight {
                tool,
                key: key.to_string(),
            },
            ToolError::ArgsMismatch { key } => DispatchError::ArgsMismatch {
                tool,
                key: key.to_string(),
            },
            ToolError::Abandoned { key } => DispatchError::Abandoned {
                tool,
                key: key.to_string(),
            },
            ToolError::AwaitingApproval { key } => DispatchError::AwaitingApproval {
                tool,
                key: key.to_string(),
            },
            ToolError::NotApproved { key, note } => DispatchError::NotApproved {
                tool,
                key: key.to_string(),
                note,
            },
            ToolError::Journal(error) => DispatchError::Journal { tool, error },
            // Only a saga returns this; a tool whose body ran one reports
            // it as its own refusal.
            ToolError::Compensated { saga, reason } => DispatchError::Tool {
                tool,
                failure: Failure::Semantic,
                message: format!("saga {saga} was rolled back: {reason}"),
            },
        }
    }
}
