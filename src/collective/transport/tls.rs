//! The `tcp_tls` transport: the TCP transport's connections under mutual TLS. After the
//! transport's own handshake (which refuses strangers and other jobs by the token's hash), each
//! connection is upgraded ([`secure`]): a rank is the TLS client on the connections it dialed
//! and the server on those it accepted. Both ends present the job CA's certificates and check
//! the other's, so gradients travel encrypted, between tasks the CA vouches for. The
//! parameter-server data plane and the control plane reuse the configurations
//! ([`RingTls`]) and [`secure_link`].
//!
//! rustls does the handshake (certificates, CA, names, key agreement); the bytes then travel
//! in TLS 1.3 records that [`Sealed`] (`record.rs`) seals and opens under the keys it agreed.
//! [`LinkStream`] is what an exchange reads and writes: a plain nonblocking socket, or a sealed
//! one. TLS 1.3 only, AES-128-GCM first: on this machine AES-128-GCM ran 5–10 GB/s per core
//! (measured with ring) against 3–9 GB/s for AES-256-GCM and under 2 GB/s for
//! ChaCha20-Poly1305.

use super::super::Peers;
use super::super::error::{CollectiveError, Secs};
use super::record::{REKEY_EXPORTER_LABEL, Rekey, Sealed};
use super::stream::PeerLink;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig, ServerConnection};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sent by the TLS server once it has accepted the client's certificate: in TLS 1.3 the
/// client's handshake ends before the server has judged it, so without this a refusal would
/// surface only at the first collective.
const ACCEPTED: u8 = 0xA5;

/// The rustls configurations of one task: its certificate, and the CA it trusts.
#[derive(Clone)]
pub struct RingTls {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

impl std::fmt::Debug for RingTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RingTls(…)")
    }
}

/// What is wrong with a task's TLS files, by file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PemError {
    #[error("holds no PEM certificate")]
    NoCertificate,
    #[error("holds no PEM private key ({0})")]
    NoKey(String),
    #[error("is not usable: {0}")]
    Unusable(String),
}

/// Which of the three files a [`PemError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PemFile {
    Cert,
    Key,
    Ca,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::{cipher_suite, default_provider};
    let suites = vec![
        cipher_suite::TLS13_AES_128_GCM_SHA256,
        cipher_suite::TLS13_AES_256_GCM_SHA384,
        cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(rustls::crypto::CryptoProvider { cipher_suites: suites, ..default_provider() })
}

fn certificates(pem: &[u8], file: PemFile) -> Result<Vec<CertificateDer<'static>>, (PemFile, PemError)> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| (file, PemError::Unusable(e.to_string())))?;
    if certs.is_empty() {
        return Err((file, PemError::NoCertificate));
    }
    Ok(certs)
}

impl RingTls {
    /// Builds both configurations from PEM text, checking that the key fits the certificate
    /// and that the CA is a certificate.
    pub fn new(cert: &[u8], key: &[u8], ca: &[u8]) -> Result<RingTls, (PemFile, PemError)> {
        let chain = certificates(cert, PemFile::Cert)?;
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| (PemFile::Key, PemError::NoKey(e.to_string())))?;
        let mut roots = RootCertStore::empty();
        for c in certificates(ca, PemFile::Ca)? {
            roots.add(c).map_err(|e| (PemFile::Ca, PemError::Unusable(e.to_string())))?;
        }
        let roots = Arc::new(roots);
        let versions = &[&rustls::version::TLS13];
        let unusable = |file, e: rustls::Error| (file, PemError::Unusable(e.to_string()));
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
            .build()
            .map_err(|e| (PemFile::Ca, PemError::Unusable(e.to_string())))?;
        let mut server = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .map_err(|e| unusable(PemFile::Cert, e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| unusable(PemFile::Key, e))?;
        // Ring links are never resumed: tickets would only be bytes in the way.
        server.send_tls13_tickets = 0;
        // Connections seal their records themselves with the handshake's keys (see [`Sealed`]).
        server.enable_secret_extraction = true;
        let mut client = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .map_err(|e| unusable(PemFile::Cert, e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| unusable(PemFile::Key, e))?;
        client.enable_secret_extraction = true;
        Ok(RingTls { client: Arc::new(client), server: Arc::new(server) })
    }
}

/// TLS for the TCP transport: this task's configurations and every rank's host name as the cluster
/// names it (the name the rank's certificate must carry), by rank.
#[derive(Debug, Clone)]
pub struct TlsPeers {
    pub config: RingTls,
    pub names: Vec<String>,
}

/// One connection as an exchange sees it.
#[derive(Debug)]
pub(crate) enum LinkStream {
    Plain(TcpStream),
    Sealed(Box<Sealed>),
}

impl LinkStream {
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            LinkStream::Plain(s) => s,
            LinkStream::Sealed(t) => t.tcp(),
        }
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.tcp().as_raw_fd()
    }

    pub(crate) fn shutdown(&self) {
        let _ = self.tcp().shutdown(Shutdown::Both);
    }

    /// Sends what a sealed link still holds; `Ok(true)` once nothing is left.
    pub(crate) fn flush_pending(&mut self) -> io::Result<bool> {
        match self {
            LinkStream::Plain(_) => Ok(true),
            LinkStream::Sealed(t) => t.flush_out(),
        }
    }
}

impl Read for LinkStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            LinkStream::Plain(s) => s.read(buf),
            LinkStream::Sealed(t) => t.read(buf),
        }
    }
}

impl Write for LinkStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            LinkStream::Plain(s) => s.write(buf),
            LinkStream::Sealed(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            LinkStream::Plain(s) => s.flush(),
            LinkStream::Sealed(t) => t.flush(),
        }
    }
}

/// Where one link's TLS handshake stands.
struct Handshake {
    conn: Connection,
    sock: TcpStream,
    /// The server has sent [`ACCEPTED`]; the client has read it.
    confirmed: bool,
}

impl Handshake {
    /// Moves the handshake on without blocking; `Ok(true)` once done and confirmed.
    fn progress(&mut self) -> Result<bool, String> {
        let io = |e: io::Error| e.to_string();
        loop {
            let mut moved = false;
            while self.conn.wants_write() {
                match self.conn.write_tls(&mut self.sock) {
                    Ok(_) => moved = true,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(io(e)),
                }
            }
            if self.conn.is_handshaking() || !self.confirmed {
                match self.conn.read_tls(&mut self.sock) {
                    Ok(0) => return Err("the connection closed during the TLS handshake".into()),
                    Ok(_) => {
                        moved = true;
                        if let Err(e) = self.conn.process_new_packets() {
                            // Tell the peer why before giving up (best effort).
                            let _ = self.conn.write_tls(&mut self.sock);
                            return Err(describe(&e));
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(io(e)),
                }
            }
            if !self.conn.is_handshaking() && !self.confirmed {
                self.confirm()?;
            }
            if self.confirmed && !self.conn.wants_write() {
                return Ok(true);
            }
            if !moved {
                return Ok(false);
            }
        }
    }

    fn confirm(&mut self) -> Result<(), String> {
        match &mut self.conn {
            Connection::Server(s) => {
                s.writer().write_all(&[ACCEPTED]).map_err(|e| e.to_string())?;
                self.confirmed = true;
            }
            Connection::Client(c) => {
                let mut byte = [0u8; 1];
                match c.reader().read(&mut byte) {
                    Ok(1) if byte[0] == ACCEPTED => self.confirmed = true,
                    Ok(_) => return Err("it sent something else than the TLS confirmation".into()),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
        Ok(())
    }

    /// The link with the handshake's traffic keys, in TLS 1.3 records sealed by [`Sealed`].
    fn into_wire(self) -> Result<LinkStream, String> {
        let failed = |e| format!("TLS failed: {e}");
        let base = self.conn.export_keying_material([0u8; 32], REKEY_EXPORTER_LABEL, None).map_err(failed)?;
        let (ours, theirs) = if matches!(self.conn, Connection::Client(_)) { (b'c', b's') } else { (b's', b'c') };
        let rekey = (Rekey::new(base, ours), Rekey::new(base, theirs));
        let secrets = self.conn.dangerous_extract_secrets().map_err(failed)?;
        Ok(LinkStream::Sealed(Box::new(Sealed::new(self.sock, secrets.tx, secrets.rx, rekey)?)))
    }
}

/// What a rustls failure means for the person running the job.
pub(crate) fn describe(e: &rustls::Error) -> String {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    match e {
        E::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => {
            "its certificate is not signed by this task's CA (cluster.tls.ca_file): it has another CA's certificate"
                .into()
        }
        E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
            format!("its certificate does not name the host this task reached it by ({e})")
        }
        E::InvalidCertificate(
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. },
        ) => {
            format!("its certificate is outside its validity period ({e})")
        }
        E::AlertReceived(A::UnknownCA | A::BadCertificate | A::CertificateUnknown | A::DecryptError) => {
            "it refused this task's certificate (cluster.tls.cert_file): it is not signed by the CA it trusts".into()
        }
        E::AlertReceived(A::CertificateRequired) | E::NoCertificatesPresented => {
            "no client certificate was presented: give every task cluster.tls".into()
        }
        other => format!("TLS failed: {other}"),
    }
}

/// Upgrades every connection of a rank to TLS, driving all the handshakes at once (a rank is
/// the client on the connections it dialed and the server on those it accepted; doing one
/// after another would deadlock around a ring). Each dialed connection's peer must present a
/// certificate for its host as the cluster names it (`TlsPeers::names`). A refusal names the
/// peer and why.
pub(crate) fn secure(
    p: &Peers,
    t: &TlsPeers,
    outs: Vec<PeerLink>,
    ins: Vec<PeerLink>,
    within: Duration,
) -> Result<(Vec<PeerLink>, Vec<PeerLink>), CollectiveError> {
    let refused = |link: &(usize, SocketAddr), reason: String| CollectiveError::Refused {
        peer: p.name(link.0).to_string(),
        addr: link.1,
        reason,
    };
    let dialed = outs.len();
    let mut ends = Vec::with_capacity(outs.len() + ins.len());
    let mut shakes = Vec::with_capacity(outs.len() + ins.len());
    for (i, PeerLink { stream, peer, addr }) in outs.into_iter().chain(ins).enumerate() {
        let LinkStream::Plain(sock) = stream else {
            return Err(CollectiveError::Invalid("internal error: a link was upgraded to TLS twice".into()));
        };
        let end = (peer, addr);
        let conn: Connection = if i < dialed {
            let name = t.names.get(peer).map_or("", String::as_str);
            let server = ServerName::try_from(name.to_owned())
                .map_err(|e| refused(&end, format!("`{name}` is not a host name TLS can check ({e})")))?;
            ClientConnection::new(t.config.client.clone(), server)
                .map_err(|e| refused(&end, format!("TLS failed: {e}")))?
                .into()
        } else {
            ServerConnection::new(t.config.server.clone())
                .map_err(|e| refused(&end, format!("TLS failed: {e}")))?
                .into()
        };
        shakes.push(Handshake { conn, sock, confirmed: false });
        ends.push(end);
    }
    let deadline = Instant::now() + within;
    let mut done = vec![false; shakes.len()];
    while let Some(first) = done.iter().position(|d| !d) {
        for (i, shake) in shakes.iter_mut().enumerate() {
            done[i] = done[i] || shake.progress().map_err(|why| refused(&ends[i], why))?;
        }
        if done.iter().all(|d| *d) {
            break;
        }
        if Instant::now() >= deadline {
            return Err(refused(&ends[first], format!("the TLS handshake did not finish within {}", Secs(within))));
        }
        let socks: Vec<&TcpStream> = shakes.iter().map(|h| &h.sock).collect();
        wait_any(&socks, Duration::from_millis(10));
    }
    let mut links = Vec::with_capacity(shakes.len());
    for (shake, end) in shakes.into_iter().zip(&ends) {
        let stream = shake.into_wire().map_err(|why| refused(end, why))?;
        links.push(PeerLink { stream, peer: end.0, addr: end.1 });
    }
    let ins = links.split_off(dialed);
    Ok((links, ins))
}

/// One link's TLS handshake, for a connection outside the collective (the parameter-server
/// data plane): the dialing side is the client and checks that the peer's certificate names
/// `name` (`Some`); the accepting side (`None`) is the server. Returns the sealed link, its
/// socket blocking again.
pub(crate) fn secure_link(
    tls: &RingTls,
    sock: TcpStream,
    name: Option<&str>,
    within: Duration,
) -> Result<LinkStream, String> {
    sock.set_nonblocking(true).map_err(|e| e.to_string())?;
    let conn: Connection = match name {
        Some(name) => {
            let server = ServerName::try_from(name.to_owned())
                .map_err(|e| format!("`{name}` is not a host name TLS can check ({e})"))?;
            ClientConnection::new(tls.client.clone(), server).map_err(|e| format!("TLS failed: {e}"))?.into()
        }
        None => ServerConnection::new(tls.server.clone()).map_err(|e| format!("TLS failed: {e}"))?.into(),
    };
    let mut link = Handshake { conn, sock, confirmed: false };
    let deadline = Instant::now() + within;
    while !link.progress()? {
        if Instant::now() >= deadline {
            return Err(format!("the TLS handshake did not finish within {:.1} s", within.as_secs_f64()));
        }
        wait_any(&[&link.sock], Duration::from_millis(10));
    }
    link.sock.set_nonblocking(false).map_err(|e| e.to_string())?;
    link.into_wire()
}

fn wait_any(socks: &[&TcpStream], limit: Duration) {
    let mut fds: Vec<libc::pollfd> =
        socks.iter().map(|s| libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
    let ms = limit.as_millis().clamp(1, 1000) as libc::c_int;
    // SAFETY: fds is a live array of pollfd for the duration of the call.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
