//! Runs left `RUNNING`: a process killed outright (SIGKILL, the out-of-memory killer, a lost
//! node) cannot end its MLflow run, so the server shows it running for ever. The next launch
//! that looks at the run folder, knowing its process is gone (it holds the folder's lock, or
//! nobody does), ends it truthfully: `KILLED`, at the last time the run logged anything, with
//! the tag [`KILLED_TAG`] saying what happened and what found it. A resumed launch then sets
//! the same run `RUNNING` again and logs on into it, as `mlflow.start_run(run_id=…)` does.

use super::client::{CallError, MlflowClient, RunRef};
use std::path::Path;

/// The tag on a run whose launch ended without ending it.
pub const KILLED_TAG: &str = "trainrun.killed";
/// The tag on a run that a launch started over in a folder whose earlier run it names.
pub const PREVIOUS_TAG: &str = "trainrun.previous_run_id";

/// Ends the run `run_id` as `KILLED` when the server still has it `RUNNING`, at its last
/// logged time, with [`KILLED_TAG`] ending in `found_by` (what found it, what happens next).
/// Returns whether it did. Only call it once the run's process is known to be gone.
pub fn end_if_running(client: &MlflowClient, run_id: &str, found_by: &str) -> Result<bool, CallError> {
    let state = client.run_state(run_id)?;
    if state.status != "RUNNING" {
        return Ok(false);
    }
    let why = format!(
        "the launch that logged this run ended without ending it (killed outright: SIGKILL, out of memory, a lost \
         node), so it was marked KILLED at the time of its last logged value; {found_by}"
    );
    client.log_batch(run_id, &[], &[], &[(KILLED_TAG.to_string(), why)])?;
    client.update_run(run_id, "KILLED", Some(state.last_ms))?;
    Ok(true)
}

/// For a folder whose process is gone ([`crate::train::run_dir::in_use`] says no): ends the
/// MLflow run its [`super::RUN_FILE`] names on the server `uri` as `KILLED` when the server
/// still has it `RUNNING`. Returns that run when it did; none when the folder names no run
/// there or the run had ended.
pub fn end_left_running(folder: &Path, uri: &str, found_by: &str) -> Result<Option<RunRef>, CallError> {
    let Some(run) = super::remembered(&folder.join(super::RUN_FILE), uri) else { return Ok(None) };
    let client = MlflowClient::new(&run.tracking_uri);
    Ok(end_if_running(&client, &run.run_id, found_by)?.then_some(run))
}
