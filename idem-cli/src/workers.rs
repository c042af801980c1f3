//! `idem workers`: the workers this machine's workers directory knows of
//! (see [`idem_runtime::admin::workers`]), and whether each one answers.

use serde::Serialize;

use idem_runtime::admin::{workers, AddressFile};

use crate::error::CliError;
use crate::reach::{reach, Unreached};

/// One worker as `idem workers` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerView {
    /// Its worker id.
    pub worker: String,
    /// `running` (it proved it holds the token), `stopped` (no address
    /// file), `gone` (its address does not answer) or `refused` (see
    /// `why`).
    pub state: &'static str,
    /// Its admin API, when it has an address file.
    pub url: Option<String>,
    /// The process, when it has an address file.
    pub pid: Option<u32>,
    /// Why it is `gone` or `refused`.
    pub why: Option<String>,
    /// Its directory.
    pub dir: String,
}

/// Every worker of the workers directory, sorted by id.
pub async fn list() -> Result<Vec<WorkerView>, CliError> {
    let base = workers::workers_dir().map_err(|e| CliError::usage(e.to_string()))?;
    let found = workers::list_workers(&base).map_err(|e| CliError::unreachable(e.to_string()))?;
    let mut views = Vec::with_capacity(found.len());
    for (id, dir) in found {
        let mut view = WorkerView {
            worker: id.clone(),
            state: "stopped",
            url: None,
            pid: None,
            why: None,
            dir: dir.display().to_string(),
        };
        // Checked as --worker checks it before reading the token there.
        let address = match workers::find_worker_dir(&base, &id) {
            Err(e) => Err(e.to_string()),
            Ok(_) => AddressFile::read(&dir).map_err(|e| e.to_string()),
        };
        match address {
            Err(why) => {
                view.state = "refused";
                view.why = Some(why);
            }
            Ok(None) => {}
            Ok(Some(address)) => {
                view.url = Some(address.url.clone());
                view.pid = Some(address.pid);
                match reach(&dir, &address).await {
                    Ok(_) => view.state = "running",
                    Err(Unreached::NoAnswer(why)) => {
                        view.state = "gone";
                        view.why = Some(why);
                    }
                    Err(Unreached::Refused(e)) => {
                        view.state = "refused";
                        view.why = Some(e.message.clone());
                    }
                }
            }
        }
        views.push(view);
    }
    Ok(views)
}
