//! Provider addresses, passed to worker processes through the environment.

use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::client::ClientConfig;
use crate::email::EmailClient;
use crate::payments::PaymentsClient;
use crate::tickets::TicketsClient;
use crate::wire::WireClient;

/// Environment variable holding the payments address.
pub const PAYMENTS_ENV: &str = "IDEM_TESTKIT_PAYMENTS_ADDR";
/// Environment variable holding the email address.
pub const EMAIL_ENV: &str = "IDEM_TESTKIT_EMAIL_ADDR";
/// Environment variable holding the tickets address.
pub const TICKETS_ENV: &str = "IDEM_TESTKIT_TICKETS_ADDR";
/// Environment variable holding the wire address.
pub const WIRE_ENV: &str = "IDEM_TESTKIT_WIRE_ADDR";

/// Where each provider listens.
///
/// ```
/// # use idem_testkit::ProviderAddrs;
/// # let addrs = ProviderAddrs {
/// #     payments: "127.0.0.1:1".parse().unwrap(), email: "127.0.0.1:2".parse().unwrap(),
/// #     tickets: "127.0.0.1:3".parse().unwrap(), wire: "127.0.0.1:4".parse().unwrap(),
/// # };
/// // Parent: std::process::Command::new(worker).envs(addrs.to_env())
/// let env = addrs.to_env();
/// // Child: ProviderAddrs::from_env()
/// let back = ProviderAddrs::from_vars(env.iter().map(|(k, v)| (k.as_str(), v.as_str()))).unwrap();
/// assert_eq!(back, addrs);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderAddrs {
    /// The payments provider.
    pub payments: SocketAddr,
    /// The email provider.
    pub email: SocketAddr,
    /// The tickets provider.
    pub tickets: SocketAddr,
    /// The wire provider.
    pub wire: SocketAddr,
}

/// An address variable that is missing or unparsable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrsEnvError {
    /// The variable.
    pub var: &'static str,
    /// What was wrong with it.
    pub problem: String,
}

impl fmt::Display for AddrsEnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "environment variable {}: {}", self.var, self.problem)
    }
}

impl std::error::Error for AddrsEnvError {}

impl ProviderAddrs {
    /// `(variable, value)` pairs for `Command::envs` (std or tokio).
    pub fn to_env(&self) -> Vec<(String, String)> {
        [
            (PAYMENTS_ENV, self.payments),
            (EMAIL_ENV, self.email),
            (TICKETS_ENV, self.tickets),
            (WIRE_ENV, self.wire),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// Reads the addresses from this process's environment.
    pub fn from_env() -> Result<Self, AddrsEnvError> {
        let vars: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| k.starts_with("IDEM_TESTKIT_"))
            .collect();
        Self::from_vars(vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    /// Reads the addresses from any `(variable, value)` pairs.
    pub fn from_vars<'a>(
        vars: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, AddrsEnvError> {
        let vars: Vec<(&str, &str)> = vars.into_iter().collect();
        let get = |var: &'static str| -> Result<SocketAddr, AddrsEnvError> {
            let value = vars
                .iter()
                .rev()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| *v)
                .ok_or_else(|| AddrsEnvError {
                    var,
                    problem: "not set".into(),
                })?;
            value.parse().map_err(|e| AddrsEnvError {
                var,
                problem: format!("{value:?} is not an address: {e}"),
            })
        };
        Ok(ProviderAddrs {
            payments: get(PAYMENTS_ENV)?,
            email: get(EMAIL_ENV)?,
            tickets: get(TICKETS_ENV)?,
            wire: get(WIRE_ENV)?,
        })
    }

    /// Clients of all four providers with default timeouts.
    pub fn clients(&self) -> Clients {
        self.clients_with(ClientConfig::default())
    }

    /// Clients of all four providers with explicit timeouts.
    pub fn clients_with(&self, config: ClientConfig) -> Clients {
        Clients {
            payments: PaymentsClient::with_config(self.payments, config),
            email: EmailClient::with_config(self.email, config),
            tickets: TicketsClient::with_config(self.tickets, config),
            wire: WireClient::with_config(self.wire, config),
        }
    }
}

/// One client per provider. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Clients {
    /// Payments client.
    pub payments: PaymentsClient,
    /// Email client.
    pub email: EmailClient,
    /// Tickets client.
    pub tickets: TicketsClient,
    /// Wire client.
    pub wire: WireClient,
}
