//! `trainrun certs SPEC --out DIR [--for kubernetes|tfjob|slurm]`: the three files
//! `cluster.tls` names, made for the host names the tasks will reach each other by: the spec's
//! own cluster (the hosts of its `host:port` lists, or this host for local tasks), the Indexed
//! Job's pods `<job>-<i>.<job>`, the TFJob operator's `<job>-<role>-<i>.<namespace>.svc`, or,
//! under Slurm, whose nodes are known only when the job starts, the names given with `--name`
//! (which also adds names anywhere else). Making them is [`crate::cluster::certs::write`].

use super::{ManifestError, Options, Target, dns_name};
use crate::exit::RunError;
use crate::prepare::Invocation;
use crate::spec::{self, Spec, Tasks};
use std::path::Path;

/// What `trainrun certs` was asked for besides the spec.
#[derive(Debug, Clone, Default)]
pub struct CertsOptions {
    /// `--for`: where the job runs; `None`: where the spec's `[cluster]` says.
    pub target: Option<Target>,
    /// `--namespace` (TFJob names carry it; default `default`).
    pub namespace: Option<String>,
    /// `--name`: more host names, IP addresses or `*.` wildcards.
    pub names: Vec<String>,
    /// `--days` the certificates are valid.
    pub days: u32,
}

/// The host of a `host:port` address (`[::1]:2222` gives `::1`).
fn host_of(address: &str) -> String {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']').to_owned()
}

/// A name a certificate can carry and TLS can check: an IP address, a DNS name, or a `*.`
/// wildcard over one.
fn check_name(name: &str) -> Result<(), ManifestError> {
    use rustls::pki_types::ServerName;
    let dns = |n: &str| matches!(ServerName::try_from(n), Ok(ServerName::DnsName(_)));
    let ok = match name.strip_prefix("*.") {
        Some(domain) => dns(domain),
        None => ServerName::try_from(name).is_ok(),
    };
    if ok {
        return Ok(());
    }
    Err(ManifestError::Spec(format!(
        "--name {name:?} is not a host name, an IP address or a `*.` wildcard over a domain: write e.g. \
         `--name node01.hpc.example.org`, `--name 10.0.0.7` or `--name '*.hpc.example.org'` (internationalized \
         names in their xn-- form)"
    )))
}

/// Every name a task is reached by, in rank order, then `options.names`, each once.
pub fn names(spec: &Spec, options: &CertsOptions) -> Result<Vec<String>, ManifestError> {
    let mut names = Vec::new();
    match options.target {
        None => {
            for (_, entry) in crate::cluster::resolve::roles(&spec.cluster) {
                match entry {
                    None => {}
                    Some(Tasks::Count(_)) => names.extend(["localhost".to_owned(), "127.0.0.1".to_owned()]),
                    Some(Tasks::Addresses(list)) => names.extend(list.iter().map(|a| host_of(a))),
                }
            }
        }
        Some(Target::Slurm) => {}
        Some(target @ (Target::Kubernetes | Target::Tfjob)) => {
            let job =
                super::job(spec, target, &Options { namespace: options.namespace.clone(), ..Options::default() })?;
            let namespace = options.namespace.as_deref().unwrap_or("default");
            names.extend(job.tasks.iter().enumerate().map(|(i, t)| match target {
                Target::Tfjob => format!("{}-{}-{}.{namespace}.svc", job.name, t.role, t.index),
                _ => format!("{0}-{i}.{0}", job.name),
            }));
        }
    }
    for name in &options.names {
        check_name(name)?;
    }
    names.extend(options.names.iter().cloned());
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    if names.is_empty() {
        return Err(ManifestError::Spec(match options.target {
            Some(_) => "Slurm picks the nodes when the job starts, so name them: `--name node01 --name node02`, or a \
                        wildcard such as `--name '*.cluster.example.org'`"
                .to_owned(),
            // Without `--for` the names come from the spec's own [cluster]: say that it has
            // none, not that Slurm needs them.
            None => "the spec's [cluster] lists no task to make certificates for (no `host:port` addresses or local \
                     tasks), and no `--for` says where the job runs: pass `--for kubernetes`, `--for tfjob` or `--for \
                     slurm` (with `--name node01 --name node02` for Slurm's nodes), or name the hosts with `--name`"
                .to_owned(),
        }));
    }
    Ok(names)
}

/// `trainrun certs`: loads the spec, writes the files into `out` and says where they go next.
pub fn run(inv: &Invocation, options: &CertsOptions, out: &Path) -> Result<(), RunError> {
    let loaded = spec::load(&inv.spec, &inv.env, &inv.sets).map_err(|e| RunError::Spec(e.to_string()))?;
    let names = names(&loaded.spec, options).map_err(|e| RunError::Spec(format!("error: {e}")))?;
    std::fs::create_dir_all(out).map_err(|e| RunError::Failure(format!("cannot create {}: {e}", out.display())))?;
    let job = dns_name(loaded.spec.run.name.as_deref().unwrap_or("trainrun"));
    let files = crate::cluster::certs::write(out, &job, &names, options.days)
        .map_err(|e| RunError::Failure(format!("{e}; nothing was overwritten")))?;
    println!(
        "wrote {}, {} and {} (the key readable by you only): one certificate for every task, valid {} days, \
         signed by a new CA, for",
        files.ca.display(),
        files.cert.display(),
        files.key.display(),
        options.days
    );
    names.iter().for_each(|n| println!("  {n}"));
    match options.target {
        Some(Target::Kubernetes | Target::Tfjob) => {
            let secret = loaded.spec.deploy.as_ref().and_then(|d| d.tls_secret.clone());
            let ns = options.namespace.as_ref().map(|n| format!(" --namespace {n}")).unwrap_or_default();
            println!(
                "next: kubectl create secret generic {}{ns} --from-file={} --from-file={} --from-file={}",
                secret.unwrap_or_else(|| format!("{job}-tls")),
                files.cert.display(),
                files.key.display(),
                files.ca.display()
            );
        }
        _ => println!(
            "next: copy the three files to every task and set in the spec: cluster.tls = {}",
            files.inline_table()
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_tls_cannot_check_are_refused() {
        for good in ["node01", "node01.hpc.example.org", "10.0.0.7", "::1", "*.hpc.example.org", "xn--nd-fka.example"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["bad name!", "nödé", "*.", "*.10.0.0.7", "a..b", ""] {
            let Err(ManifestError::Spec(m)) = check_name(bad) else { panic!("{bad:?} accepted") };
            assert!(m.starts_with(&format!("--name {bad:?} is not a host name")), "{m}");
        }
    }

    #[test]
    fn hosts_come_out_of_addresses() {
        assert_eq!(host_of("10.0.0.1:2222"), "10.0.0.1");
        assert_eq!(host_of("node-3.example:2222"), "node-3.example");
        assert_eq!(host_of("[::1]:2222"), "::1");
    }
}
