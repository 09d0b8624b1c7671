//! Test certificates made with rcgen: a CA, and leaf certificates it signs for the names a
//! task is reached by. Written as PEM files, as an operator would hand them to trainrun.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// A certificate authority that can sign task certificates.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// Its certificate, as a PEM file.
    pub pem: PathBuf,
}

/// The three files a task's `cluster.tls` names.
pub struct TaskFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl TaskFiles {
    /// `cluster.tls` as a `--set` value.
    pub fn set(&self) -> String {
        format!(
            "cluster.tls={{ cert_file = \"{}\", key_file = \"{}\", ca_file = \"{}\" }}",
            self.cert.display(),
            self.key.display(),
            self.ca.display()
        )
    }
}

impl Ca {
    /// A new CA named `name`, its certificate written to `dir/<name>.crt`.
    pub fn new(dir: &Path, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let pem = dir.join(format!("{name}.crt"));
        std::fs::write(&pem, issuer.pem()).unwrap();
        Ca { issuer, pem }
    }

    /// A certificate for `names` (DNS names or IP addresses), for both ends of a link, as
    /// `dir/<file>.crt` and `.key`.
    pub fn task(&self, dir: &Path, file: &str, names: &[&str]) -> TaskFiles {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, file);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_path, key_path) = (dir.join(format!("{file}.crt")), dir.join(format!("{file}.key")));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        TaskFiles { cert: cert_path, key: key_path, ca: self.pem.clone() }
    }
}
