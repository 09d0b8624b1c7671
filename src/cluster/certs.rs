//! A job's TLS files made on the spot: a CA, and one certificate it signs for every name the
//! tasks are reached by, written under the names `trainrun manifest`'s Secret mounts
//! (`ca.crt`, `tls.crt`, `tls.key`). rcgen makes them (ECDSA P-256), as the tests' CA does.
//! `trainrun bench --only tls` uses them; a private key is written owner-only, and no file
//! that exists is overwritten.

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

/// A CA named `job` and a certificate it signs for `names` (DNS names or IP addresses, for
/// both ends of a link), written into `dir`.
pub fn write(dir: &Path, job: &str, names: &[String]) -> Result<TlsFiles, CertError> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, format!("{job} CA"));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
    let mut leaf = CertificateParams::new(names.to_vec())?;
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
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_files_load_as_a_tasks_tls_and_are_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let names = ["localhost".to_string(), "127.0.0.1".to_string()];
        let files = write(dir.path(), "bench", &names).unwrap();
        assert!(TlsMaterial::load(files.clone()).is_ok(), "the key fits the certificate and the CA signed it");
        let mode = std::fs::metadata(&files.key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the private key is the owner's only");
        let before = std::fs::read(&files.key).unwrap();
        let again = write(dir.path(), "bench", &names).unwrap_err();
        assert!(again.to_string().contains("ca.crt") && again.to_string().contains("exists"), "{again}");
        assert_eq!(std::fs::read(&files.key).unwrap(), before);
    }
}
