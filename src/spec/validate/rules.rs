//! Rules a JSON Schema cannot express, checked on the merged spec with the schema's problems:
//! learning-rate table keys that name one batch twice (`"64"` and `"064"`), a
//! `cluster.token_file` that other users can read (refused as ssh refuses such a key), an
//! empty `run.out_dir` (which would make the working directory the run folder), and a
//! `run.tracking.mlflow` that is no `http(s)://` server (trainrun speaks MLflow's REST API only).

use crate::spec::keypath::{self, Seg};
use crate::spec::render::Finding;
use crate::spec::tracking::NotAServer;
use figment::value::Value;
use std::collections::BTreeMap;

/// Every problem of these rules in `value`, the merged spec.
pub(crate) fn check(value: &Value) -> Vec<Finding> {
    let mut findings = Vec::new();
    if let Some(Value::Dict(_, table)) = value.find_ref("optimizer.scaling.table") {
        findings.extend(table_duplicates(table.keys()));
    }
    if let Some(Value::String(_, path)) = value.find_ref("cluster.token_file") {
        findings.extend(token_file(path));
    }
    if let Some(Value::String(_, dir)) = value.find_ref("run.out_dir") {
        findings.extend(empty_out_dir(dir));
    }
    if let Some(Value::String(_, uri)) = value.find_ref("run.tracking.mlflow") {
        findings.extend(tracking_address(uri));
    }
    findings
}

/// A tracking address that is no `http://` or `https://` server. MLflow's own clients also take
/// a store (`./mlruns`, `file:`, `sqlite:`, `databricks`), which trainrun cannot write: it logs
/// through a server's REST API, so such a run would only warn that the server is unreachable.
fn tracking_address(uri: &str) -> Option<Finding> {
    let trimmed = uri.trim();
    let help = match crate::spec::tracking::server_address(uri).err()? {
        NotAServer::NoScheme => format!("name the server with its scheme: `mlflow = \"http://{trimmed}\"`"),
        NotAServer::Store => "trainrun logs through an MLflow server's REST API: serve that store with `mlflow server \
             --backend-store-uri STORE` and name the server, e.g. `mlflow = \"http://127.0.0.1:5000\"`; or remove \
             `run.tracking.mlflow` for no tracking"
            .to_string(),
    };
    Some(
        Finding::new(
            "run.tracking.mlflow",
            format!("`run.tracking.mlflow` = {uri:?} is not an http:// or https:// address of an MLflow server"),
        )
        .label("not a server")
        .help(help),
    )
}

/// An empty `run.out_dir`: the run would write `run.json`, weights and `tensorboard/` into
/// whatever folder it was started from.
fn empty_out_dir(dir: &str) -> Option<Finding> {
    if !dir.trim().is_empty() {
        return None;
    }
    Some(
        Finding::new(
            "run.out_dir",
            format!("`run.out_dir` = {dir:?} is empty: the run would write its files into the current folder"),
        )
        .label("empty")
        .help(
            "name a folder of the run's own, e.g. `run.out_dir = \"runs/mnist\"`, or leave the key out for \
             runs/<run.name>",
        ),
    )
}

/// Keys of the learning-rate table that name a batch size an earlier key already names.
fn table_duplicates<'k>(keys: impl Iterator<Item = &'k String>) -> Vec<Finding> {
    let mut seen: BTreeMap<u64, &str> = BTreeMap::new();
    let mut findings = Vec::new();
    for key in keys {
        let Ok(batch) = key.trim().parse::<u64>() else { continue };
        match seen.get(&batch) {
            None => {
                seen.insert(batch, key);
            }
            Some(first) => {
                let path = [Seg::Key("optimizer".into()), Seg::Key("scaling".into()), Seg::Key("table".into())];
                let mut at = path.to_vec();
                at.push(Seg::Key(key.clone()));
                findings.push(
                    Finding::new(
                        keypath::format(&at),
                        format!(
                            "`optimizer.scaling.table` gives the global batch {batch} twice, as {first:?} and {key:?}"
                        ),
                    )
                    .at_key()
                    .label(format!("the same batch as {first:?}"))
                    .help(format!("keep one learning rate per batch: remove {key:?} or {first:?}")),
                );
            }
        }
    }
    findings
}

/// A token file that group or other users may read or write: anyone who reads the token can
/// join or steer the job. ssh refuses a private key with such permissions for the same reason.
fn token_file(path: &str) -> Option<Finding> {
    use std::os::unix::fs::PermissionsExt;
    // A file that is not there (yet) is the runtime's error: `check` may run elsewhere.
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    if mode & 0o077 == 0 {
        return None;
    }
    Some(
        Finding::new(
            "cluster.token_file",
            format!("`cluster.token_file` = {path:?} is open to other users (permissions {mode:04o}); the job token must be private"),
        )
        .label("readable by others")
        .help(format!(
            "run `chmod 600 {path}`, as ssh requires of a private key (on Kubernetes, mount the Secret with defaultMode: 0400)"
        )),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_batch_named_twice_is_refused_at_the_second_key() {
        let keys = ["064".to_string(), "128".to_string(), "64".to_string(), "fast".to_string()];
        let found = table_duplicates(keys.iter());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].diag.key, "optimizer.scaling.table.64");
        assert!(found[0].diag.message.contains("batch 64 twice, as \"064\" and \"64\""), "{}", found[0].diag.message);
    }

    #[test]
    fn an_empty_out_dir_is_refused() {
        assert!(empty_out_dir("").is_some_and(|f| f.diag.key == "run.out_dir"));
        assert!(empty_out_dir(" ").is_some());
        assert!(empty_out_dir("runs/a").is_none());
    }

    #[test]
    fn a_tracking_address_must_be_an_http_server() {
        assert!(tracking_address("http://127.0.0.1:5000").is_none());
        assert!(tracking_address("HTTPS://mlflow.example.com/prefix").is_none());
        let help = |uri: &str| tracking_address(uri).and_then(|f| f.diag.help).unwrap_or_default();
        assert_eq!(help("localhost:5000"), "name the server with its scheme: `mlflow = \"http://localhost:5000\"`");
        for store in [
            "./mlruns",
            "file:///tmp/mlruns",
            "file:./mlruns",
            "sqlite:mlflow.db",
            "sqlite:///mlflow.db",
            "databricks",
            "",
            "http://",
        ] {
            assert!(help(store).contains("mlflow server --backend-store-uri STORE"), "{store}: {}", help(store));
        }
        let message = tracking_address("./mlruns").map(|f| f.diag.message).unwrap_or_default();
        assert_eq!(
            message,
            "`run.tracking.mlflow` = \"./mlruns\" is not an http:// or https:// address of an MLflow server"
        );
    }

    #[test]
    fn a_token_file_others_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.token");
        std::fs::write(&path, "0123456789abcdef0123").unwrap();
        let text = path.display().to_string();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let found = token_file(&text).map(|f| f.diag.message).unwrap_or_default();
        assert!(found.contains("permissions 0644"), "{found}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(token_file(&text).is_some(), "group-readable too");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(token_file(&text).is_none());
        assert!(token_file("/nonexistent/job.token").is_none(), "missing files are the runtime's error");
    }
}
