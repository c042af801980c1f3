//! From a directory's admin files to a server that proved it holds the
//! token: what `--journal DIR`, `--worker ID` and `idem workers` share.

use std::path::Path;

use idem_runtime::admin::{proof, AddressFile};

use crate::client::{Client, Proof};
use crate::error::CliError;

/// Why the admin files in a directory did not lead to a server.
pub enum Unreached {
    /// Nothing answered there (why): the process is gone.
    NoAnswer(String),
    /// The file, the token or the server was refused.
    Refused(CliError),
}

/// The client of the server that the address file in `dir` names, once it
/// proved that it holds the token for that address and that start (the
/// token is sent only then).
pub async fn reach(dir: &Path, address: &AddressFile) -> Result<Client, Unreached> {
    loopback_url(address).map_err(|why| {
        Unreached::Refused(CliError::unreachable(format!(
            "refusing {}: {why}",
            idem_runtime::admin::address_path(dir).display()
        )))
    })?;
    let token = Client::token_for(dir).map_err(Unreached::Refused)?;
    let client = Client::new(address.url.clone(), token).map_err(Unreached::Refused)?;
    let binding = proof::Binding::Server {
        addr: address.addr,
        instance: &address.instance,
    };
    match client.proves(binding).await {
        Proof::Proven => Ok(client),
        Proof::NoAnswer(why) => Err(Unreached::NoAnswer(why)),
        Proof::Unproven(why) => Err(Unreached::Refused(crate::client::unproven(
            &address.url,
            &why,
        ))),
    }
}

/// Whether the address file's URL is one this CLI calls: `http://` and the
/// loopback address the file says the server is bound to (or, for a
/// wildcard bind, loopback with its port). Anything else is refused: the
/// token is not sent off this machine on a file's word.
fn loopback_url(address: &AddressFile) -> Result<(), String> {
    let Some(rest) = address.url.strip_prefix("http://") else {
        return Err(format!(
            "its URL {:?} is not http:// on loopback",
            address.url
        ));
    };
    let target: std::net::SocketAddr = rest
        .trim_end_matches('/')
        .parse()
        .map_err(|_| format!("its URL {:?} is not http://IP:PORT", address.url))?;
    if !target.ip().is_loopback() {
        return Err(format!(
            "its URL {:?} is not a loopback address (reach a remote admin API with --url)",
            address.url
        ));
    }
    let bound = address.addr;
    let same_ip = bound.ip() == target.ip() || bound.ip().is_unspecified();
    if !same_ip || bound.port() != target.port() {
        return Err(format!(
            "its URL {:?} does not match the address it says the server is bound to ({bound})",
            address.url
        ));
    }
    Ok(())
}
