//! Mutual TLS for a job (`cluster.tls`): every task presents its certificate and accepts only
//! peers whose certificate the job's CA signed, on the control plane (tonic over rustls) and on
//! the TCP ring ([`crate::collective::tls`]). The job token is still required: TLS proves a
//! peer belongs to the organisation's CA, the token that it belongs to this job.
//!
//! The runtime gets the files as [`TlsFiles`], a plain struct, never the spec; they are read and
//! checked once ([`TlsMaterial::load`]), so a wrong path or a key that does not fit its
//! certificate fails before any task waits on another.

use crate::collective::{PemError, PemFile, RingTls};
use std::path::{Path, PathBuf};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// Where a task's TLS files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// This task's certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The job's CA certificate (PEM).
    pub ca: PathBuf,
}

impl TlsFiles {
    /// The files as `cluster.tls`'s TOML inline table.
    pub fn inline_table(&self) -> String {
        let quoted = |p: &Path| toml::Value::String(p.display().to_string()).to_string();
        format!(
            "{{ cert_file = {}, key_file = {}, ca_file = {} }}",
            quoted(&self.cert),
            quoted(&self.key),
            quoted(&self.ca)
        )
    }
}

/// A TLS file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read cluster.tls.{key} {}: {source}", path.display())]
    Read {
        key: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cluster.tls.{key} {} {problem}", path.display())]
    Bad { key: &'static str, path: PathBuf, problem: PemError },
}

/// The files' contents, checked.
pub struct TlsMaterial {
    files: TlsFiles,
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Vec<u8>,
    ring: RingTls,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial").field("files", &self.files).finish_non_exhaustive()
    }
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { key, path: path.to_owned(), source })
}

impl TlsMaterial {
    /// Reads the three files and checks that they make a usable identity.
    pub fn load(files: TlsFiles) -> Result<TlsMaterial, TlsError> {
        let cert = read("cert_file", &files.cert)?;
        let key = read("key_file", &files.key)?;
        let ca = read("ca_file", &files.ca)?;
        let ring = RingTls::new(&cert, &key, &ca).map_err(|(file, problem)| {
            let (key, path) = match file {
                PemFile::Cert => ("cert_file", &files.cert),
                PemFile::Key => ("key_file", &files.key),
                PemFile::Ca => ("ca_file", &files.ca),
            };
            TlsError::Bad { key, path: path.clone(), problem }
        })?;
        Ok(TlsMaterial { files, cert, key, ca, ring })
    }

    /// Where the files are.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The ring's configurations.
    pub fn ring(&self) -> &RingTls {
        &self.ring
    }

    /// The control plane's server side: clients must present a certificate the CA signed.
    pub(crate) fn server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert, &self.key))
            .client_ca_root(Certificate::from_pem(&self.ca))
    }

    /// The control plane's client side, reaching the chief at `host`.
    pub(crate) fn client(&self, host: &str) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .identity(Identity::from_pem(&self.cert, &self.key))
            .domain_name(host)
    }
}

/// The host part of `host:port` (`[::1]:2222` gives `::1`).
pub(crate) fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// When a control-plane call failed in TLS, what that means; `None` for other failures.
pub(crate) fn explain(status: &tonic::Status) -> Option<String> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(status);
    while let Some(e) = next {
        if let Some(t) = e.downcast_ref::<rustls::Error>() {
            return Some(crate::collective::tls::describe(t));
        }
        let inner = e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref());
        if let Some(t) = inner.and_then(|i| i.downcast_ref::<rustls::Error>()) {
            return Some(crate::collective::tls::describe(t));
        }
        // h2 passes I/O errors on as text, so an alert the chief sent arrives as rustls's
        // words for it.
        if let Some(alert) = inner.and_then(|i| i.to_string().strip_prefix("received fatal alert: ").map(str::to_owned))
        {
            let refused = ["UnknownCA", "BadCertificate", "CertificateUnknown", "CertificateRequired", "DecryptError"];
            return Some(match refused.contains(&alert.as_str()) {
                true => crate::collective::tls::describe(&rustls::Error::AlertReceived(
                    rustls::AlertDescription::BadCertificate,
                )),
                false => format!("TLS failed: the chief sent the alert {alert}"),
            });
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_lose_their_port_and_brackets() {
        assert_eq!(host_of("job-0.svc:2222"), "job-0.svc");
        assert_eq!(host_of("[::1]:2222"), "::1");
        assert_eq!(host_of("127.0.0.1:9"), "127.0.0.1");
    }

    #[test]
    fn missing_and_garbled_files_name_their_key() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not pem").unwrap();
        let files = |cert: &Path| TlsFiles { cert: cert.to_owned(), key: junk.clone(), ca: junk.clone() };
        let e = TlsMaterial::load(files(&dir.path().join("missing.crt"))).unwrap_err();
        assert!(e.to_string().starts_with("cannot read cluster.tls.cert_file"), "{e}");
        let e = TlsMaterial::load(files(&junk)).unwrap_err();
        assert!(e.to_string().contains("cluster.tls.cert_file") && e.to_string().contains("no PEM certificate"), "{e}");
    }
}
