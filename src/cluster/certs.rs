//! A job's TLS files made on the spot: a CA, and one certificate it signs for every name the
//! tasks are reached by, shared by every task as the manifest's one Secret is, written under
//! the names that Secret mounts (`ca.crt`, `tls.crt`, `tls.key`). rcgen makes them (ECDSA
//! P-256). `trainrun certs` and `trainrun bench --only tls` use them. The private key is
//! written owner-only, no file that exists is overwritten, and the CA's key is not kept: a
//! new task name means a new set, handed to every task.

use super::tls::TlsFiles;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Why the files could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot make the certificates: {0}")]
    Make(#[from] rcgen::Error),
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Writes `contents` to a new file `path` with permissions `mode`.
fn create(path: PathBuf, contents: &str, mode: u32) -> Result<PathBuf, CertError> {
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&path)
        .and_then(|mut f| f.write_all(contents.as_bytes()));
    match written {
        Ok(()) => Ok(path),
        Err(source) => Err(CertError::Write { path, source }),
    }
}

/// A CA named `job` and a certificate it signs for `names` (DNS names, `*.` wildcards or IP
/// addresses, for both ends of a link), valid from an hour ago (clocks differ) for `days`,
/// written into `dir`.
pub fn write(dir: &Path, job: &str, names: &[String], days: u32) -> Result<TlsFiles, CertError> {
    // All three or none: a new CA beside an old certificate would fit nothing.
    if let Some(path) = ["ca.crt", "tls.crt", "tls.key"].map(|f| dir.join(f)).into_iter().find(|p| p.exists()) {
        let source = std::io::Error::new(std::io::ErrorKind::AlreadyExists, "it exists already");
        return Err(CertError::Write { path, source });
    }
    let now = time::OffsetDateTime::now_utc();
    let (from, until) = (now - time::Duration::hours(1), now + time::Duration::days(days.into()));
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    (ca.not_before, ca.not_after) = (from, until);
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, format!("{job} CA"));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
    let mut leaf = CertificateParams::new(names.to_vec())?;
    (leaf.not_before, leaf.not_after) = (from, until);
    leaf.distinguished_name.push(DnType::CommonName, job);
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate()?;
    let cert = leaf.signed_by(&key, &issuer)?;
    Ok(TlsFiles {
        ca: create(dir.join("ca.crt"), &issuer.pem(), 0o644)?,
        cert: create(dir.join("tls.crt"), &cert.pem(), 0o644)?,
        key: create(dir.join("tls.key"), &key.serialize_pem(), 0o600)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::tls::TlsMaterial;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;

    /// Whether a client that trusts `files.ca` accepts the certificate for `name`: a TLS
    /// handshake in memory, rustls on both ends.
    fn accepted(files: &TlsFiles, name: &str) -> bool {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain: Vec<CertificateDer> =
            CertificateDer::pem_file_iter(&files.cert).unwrap().collect::<Result<_, _>>().unwrap();
        let key = PrivateKeyDer::from_pem_file(&files.key).unwrap();
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(&files.ca).unwrap() {
            roots.add(ca.unwrap()).unwrap();
        }
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::try_from(name.to_owned()).unwrap();
        let mut c = rustls::ClientConnection::new(Arc::new(client), name).unwrap();
        let mut s = rustls::ServerConnection::new(Arc::new(server)).unwrap();
        for _ in 0..8 {
            let mut bytes = Vec::new();
            c.write_tls(&mut bytes).unwrap();
            if s.read_tls(&mut &bytes[..]).is_err() || s.process_new_packets().is_err() {
                return false;
            }
            let mut bytes = Vec::new();
            s.write_tls(&mut bytes).unwrap();
            if c.read_tls(&mut &bytes[..]).is_err() || c.process_new_packets().is_err() {
                return false;
            }
            if !c.is_handshaking() && !s.is_handshaking() {
                return true;
            }
        }
        false
    }

    #[test]
    fn the_certificate_covers_its_names_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let names = ["localhost", "127.0.0.1", "job-0.job", "*.pods.example"].map(String::from);
        let files = write(dir.path(), "job", &names, 30).unwrap();
        for name in ["localhost", "127.0.0.1", "job-0.job", "a.pods.example"] {
            assert!(accepted(&files, name), "{name} is not covered");
        }
        for name in ["job-1.job", "10.0.0.1", "a.b.pods.example", "pods.example"] {
            assert!(!accepted(&files, name), "{name} is covered");
        }
    }

    #[test]
    fn the_files_load_as_a_tasks_tls_and_are_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let names = ["localhost".to_string(), "127.0.0.1".to_string()];
        let files = write(dir.path(), "bench", &names, 1).unwrap();
        assert!(TlsMaterial::load(files.clone()).is_ok(), "the key fits the certificate and the CA signed it");
        let mode = std::fs::metadata(&files.key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the private key is the owner's only");
        let before = std::fs::read(&files.key).unwrap();
        let again = write(dir.path(), "bench", &names, 1).unwrap_err();
        assert!(again.to_string().contains("ca.crt") && again.to_string().contains("exists"), "{again}");
        assert_eq!(std::fs::read(&files.key).unwrap(), before);
        // One file left from an earlier set is enough to refuse, before anything is written.
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("tls.key"), "kept").unwrap();
        let err = write(other.path(), "bench", &names, 1).unwrap_err();
        assert!(err.to_string().contains("tls.key"), "{err}");
        assert!(!other.path().join("ca.crt").exists(), "nothing was written beside it");
    }
}
