//! `[deploy]`: what only `trainrun manifest` reads to write Kubernetes, Kubeflow TFJob and
//! Slurm job files: the image, the resources each task requests, the volume that keeps the
//! chief's run folder and backups, and where pods may run. Training ignores the section, and
//! it is outside the results hash, so deploying a spec never changes what it trains.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `[deploy]`: settings for `trainrun manifest`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeploySpec {
    /// The container image holding `trainrun` (the repository's `Containerfile` builds one);
    /// `--image` overrides it. Default: `trainrun:<version>`. Example: `image = "registry.example.com/trainrun:0.1.0"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        pattern(r"^[^\s]*[^\s:@/]$"),
        title = "container image reference",
        extend("examples" = ["registry.example.com/trainrun:0.1.0"])
    )]
    pub image: Option<String>,
    /// CPU each task requests, as a Kubernetes quantity (`"2"`, `"500m"`); Slurm gets it as
    /// `--cpus-per-task`, rounded up. Default: `run.threads` when set, else no request.
    /// Example: `cpu = "2"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^[0-9]+(\.[0-9]+)?m?$"), title = "Kubernetes CPU quantity", extend("examples" = ["2", "500m"]))]
    pub cpu: Option<String>,
    /// Memory each task requests, as a Kubernetes quantity (`"4Gi"`, `"512Mi"`); Slurm gets it
    /// as `--mem`. Default: no request. Example: `memory = "4Gi"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        pattern(r"^[0-9]+(Ki|Mi|Gi|Ti|K|M|G|T)?$"),
        title = "Kubernetes memory quantity",
        extend("examples" = ["4Gi", "512Mi"])
    )]
    pub memory: Option<String>,
    /// Node labels a pod's node must have (Kubernetes `nodeSelector`). Default: none.
    /// Example: `node_selector = { "cloud.google.com/gke-nodepool" = "cpu-pool" }`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// The volume mounted at `/runs` that holds the run folder and the chief's backups, so a
    /// recreated chief pod resumes. Default: a new 10Gi `ReadWriteOnce` claim named `<job>-runs`.
    /// Example: `volume = { kind = "claim", name = "team-runs" }`.
    #[serde(default)]
    pub volume: VolumeSpec,
    /// The port each task's control plane listens on (Kubernetes and TFJob). Default: `2222`.
    /// Example: `port = 2222`.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// An existing Secret whose key `token` holds the job token. Default: the manifest
    /// includes a Secret `<job>-token` with a freshly drawn token. Example: `token_secret = "my-job-token"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret: Option<String>,
    /// The Secret holding `tls.crt`, `tls.key` and `ca.crt` for `cluster.tls`, mounted at
    /// `/etc/trainrun/tls`. Default: `<job>-tls`. Example: `tls_secret = "trainrun-tls"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_secret: Option<String>,
    /// The Slurm partition (`#SBATCH --partition`), or several separated by commas.
    /// Default: the cluster's default. Example: `partition = "cpu"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        pattern(r"^[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*$"),
        title = "Slurm partition names",
        extend("examples" = ["cpu", "cpu,long"])
    )]
    pub partition: Option<String>,
    /// The Slurm time limit (`#SBATCH --time`, `[D-]HH:MM:SS`). Default: the partition's.
    /// Example: `time_limit = "02:00:00"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        pattern(r"^([0-9]+-)?[0-9]{1,2}:[0-9]{2}:[0-9]{2}$"),
        title = "Slurm time limit",
        extend("examples" = ["02:00:00", "1-12:00:00"])
    )]
    pub time_limit: Option<String>,
}

fn default_port() -> u16 {
    2222
}

impl Default for DeploySpec {
    fn default() -> Self {
        DeploySpec {
            image: None,
            cpu: None,
            memory: None,
            node_selector: BTreeMap::new(),
            volume: VolumeSpec::default(),
            port: default_port(),
            token_secret: None,
            tls_secret: None,
            partition: None,
            time_limit: None,
        }
    }
}

/// `deploy.volume`: where the run folder lives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum VolumeSpec {
    /// An existing PersistentVolumeClaim.
    Claim {
        /// The claim's name. Example: `name = "team-runs"`.
        name: String,
    },
    /// A claim the manifest creates, named `<job>-runs`.
    New {
        /// Its size, as a Kubernetes quantity. Default: `"10Gi"`. Example: `size = "50Gi"`.
        #[serde(default = "default_size")]
        #[schemars(pattern(r"^[0-9]+(Ki|Mi|Gi|Ti)$"), title = "Kubernetes storage quantity", extend("examples" = ["10Gi", "50Gi"]))]
        size: String,
        /// Its storage class. Default: the cluster's default class. Example: `storage_class = "nfs"`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        storage_class: Option<String>,
        /// How pods may mount it: every task mounts it, so with `read_write_once` all pods must
        /// share a node; `read_write_many` (NFS-like classes) lets them spread.
        /// Default: `read_write_once`. Example: `access_mode = "read_write_many"`.
        #[serde(default)]
        access_mode: AccessMode,
    },
}

impl Default for VolumeSpec {
    fn default() -> Self {
        VolumeSpec::New { size: default_size(), storage_class: None, access_mode: AccessMode::default() }
    }
}

fn default_size() -> String {
    "10Gi".to_owned()
}

/// A PersistentVolumeClaim's access mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AccessMode {
    /// `ReadWriteOnce`: one node mounts it.
    #[default]
    ReadWriteOnce,
    /// `ReadWriteMany`: many nodes mount it.
    ReadWriteMany,
}

impl AccessMode {
    /// Kubernetes' spelling.
    pub fn kubernetes(self) -> &'static str {
        match self {
            AccessMode::ReadWriteOnce => "ReadWriteOnce",
            AccessMode::ReadWriteMany => "ReadWriteMany",
        }
    }
}
