//! TLS 1.3 application-data records on a ring link after the handshake (RFC 8446 §5): a
//! 5-byte header (`23, 3, 3`, length), then the sealed inner plaintext (the bytes, the content
//! type 23) and the tag; at most 16 KiB of bytes per record, the header as additional data, and
//! the nonce the IV XOR the record's sequence number. rustls agreed the keys, IVs and sequence
//! numbers; a rustls peer reads these records and writes ones [`Sealed`] reads (a unit test
//! checks both ways).
//!
//! Why not rustls's own record layer: in its buffered API every received byte is copied three
//! times (into its deframer, into its plaintext queue, out to the reader) and every sent byte
//! once more, and on the two-worker job those copies cost as much CPU as AES-GCM itself. Here
//! a record is sealed straight from the caller's gradients into the send buffer (aws-lc-rs's
//! out-of-place seal, the content type as its extra input) and opened straight from the receive
//! buffer into the caller's, so the only copies are the kernel's, as in plain TCP.
//!
//! Keys are not used forever: RFC 8446 §5.5 allows AES-GCM about 2^24.5 full records per key
//! (≈ 380 GB, some 35,000 steps of the two-worker tutorial job), and rustls's record layer
//! sends a KeyUpdate before that. Its extracted secrets cannot be updated, so after
//! [`RECORDS_PER_KEY`] records in a direction both ends move that direction to the next key,
//! derived with HKDF-SHA256 from keying material the handshake exported (RFC 8446 §7.5, the
//! mechanism meant for deriving keys outside TLS): the same record count on both ends, so no
//! message is needed. A rustls peer reads the records up to that point, not after it.

use aws_lc_rs::aead::{self, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::hkdf;
use rustls::ConnectionTrafficSecrets;
use std::io::{self, Read, Write};
use std::net::TcpStream;

const HEADER_LEN: usize = 5;
/// AES-GCM's and ChaCha20-Poly1305's tag length.
const TAG_LEN: usize = 16;
/// The most bytes a TLS 1.3 record may carry (RFC 8446 §5.1).
const MAX_PLAINTEXT: usize = 1 << 14;
/// The longest record body a peer may send: bytes, content type, padding and tag (§5.2).
const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
/// What a record of ours adds to its bytes: header, content type, tag.
const OVERHEAD: usize = HEADER_LEN + 1 + TAG_LEN;
const APPLICATION_DATA: u8 = 23;
const ALERT: u8 = 21;
/// TLS 1.2's version number, which TLS 1.3 records carry in their header (§5.1).
const LEGACY_VERSION: [u8; 2] = [3, 3];
/// Bytes sealed per write: 16 records, so one write syscall sends many records while what it
/// sends is still in L2.
pub(crate) const SEAL_BATCH_BYTES: usize = 32 * MAX_PLAINTEXT;
/// Ciphertext read per receive syscall, at most.
const RX_BYTES: usize = 512 << 10;

/// Records sealed under one key before both ends move to the next (see the module docs).
const RECORDS_PER_KEY: u64 = 1 << 24;
/// The exporter label the handshake derives [`Rekey::base`] with.
pub(crate) const REKEY_EXPORTER_LABEL: &[u8] = b"EXPORTER-trainrun-ring-next-keys";
/// What HKDF expands [`Rekey::base`] under, followed by the writer's side and the key's number.
const REKEY_INFO: &[u8] = b"trainrun ring key";

/// Where a direction's later keys come from.
#[derive(Clone, Copy)]
pub(crate) struct Rekey {
    /// 32 bytes exported from the handshake, known to both ends of this link only.
    pub base: [u8; 32],
    /// Which end writes this direction: `b'c'` the TLS client, `b's'` the server.
    pub writer: u8,
    /// Records per key ([`RECORDS_PER_KEY`]; tests make it small).
    pub every: u64,
}

impl Rekey {
    pub(crate) fn new(base: [u8; 32], writer: u8) -> Rekey {
        Rekey { base, writer, every: RECORDS_PER_KEY }
    }
}

/// An HKDF output length.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

fn invalid(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// One direction's key, IV and next sequence number, and how it moves to the next key.
struct DirectionKeys {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
    algorithm: &'static aead::Algorithm,
    rekey: Rekey,
    /// Records under the current key, and which key it is (0: the handshake's).
    records: u64,
    epoch: u32,
}

impl DirectionKeys {
    fn new((seq, secrets): (u64, ConnectionTrafficSecrets), rekey: Rekey) -> Result<DirectionKeys, String> {
        let (algorithm, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (&aead::CHACHA20_POLY1305, key, iv),
            // The enum is non-exhaustive (a catch-all is required); the handshake's provider
            // offers only the three suites above.
            _ => return Err("TLS agreed on a cipher the ring cannot use".to_owned()),
        };
        let key = UnboundKey::new(algorithm, key.as_ref()).map_err(|_| "a TLS key of the wrong size".to_owned())?;
        let iv: [u8; NONCE_LEN] = iv.as_ref().try_into().map_err(|_| "a TLS IV of the wrong size".to_owned())?;
        Ok(DirectionKeys { key: LessSafeKey::new(key), iv, seq, algorithm, rekey, records: 0, epoch: 0 })
    }

    /// Moves to the next key and IV, with sequence numbers from 0 again.
    fn next_key(&mut self) -> io::Result<()> {
        let failed = |_| invalid("cannot derive the link's next TLS key");
        self.epoch += 1;
        let epoch = self.epoch.to_be_bytes();
        let writer = [self.rekey.writer];
        let info: [&[u8]; 3] = [REKEY_INFO, &writer, &epoch];
        let key_len = self.algorithm.key_len();
        let mut material = [0u8; 32 + NONCE_LEN];
        let material = &mut material[..key_len + NONCE_LEN];
        let prk = hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, &self.rekey.base);
        prk.expand(&info, Len(material.len())).and_then(|okm| okm.fill(material)).map_err(failed)?;
        let (key, iv) = material.split_at(key_len);
        self.key = LessSafeKey::new(UnboundKey::new(self.algorithm, key).map_err(failed)?);
        self.iv.copy_from_slice(iv);
        (self.seq, self.records) = (0, 0);
        Ok(())
    }

    fn nonce(&mut self) -> io::Result<Nonce> {
        if self.records == self.rekey.every {
            self.next_key()?;
        }
        self.records += 1;
        let mut n = self.iv;
        for (b, s) in n[NONCE_LEN - 8..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        self.seq += 1;
        Ok(Nonce::assume_unique_for_key(n))
    }

    /// Seals `bytes` as one record into `record` (`bytes.len() + OVERHEAD` long).
    fn seal(&mut self, bytes: &[u8], record: &mut [u8]) -> io::Result<()> {
        let body = (bytes.len() + 1 + TAG_LEN) as u16;
        let [hi, lo] = body.to_be_bytes();
        let header = [APPLICATION_DATA, LEGACY_VERSION[0], LEGACY_VERSION[1], hi, lo];
        let (head, rest) = record.split_at_mut(HEADER_LEN);
        head.copy_from_slice(&header);
        let (sealed, type_and_tag) = rest.split_at_mut(bytes.len());
        let nonce = self.nonce()?;
        self.key
            .seal_out_of_place_scatter(nonce, Aad::from(header), bytes, sealed, &[APPLICATION_DATA], type_and_tag)
            .map_err(|_| invalid("cannot seal a TLS record"))
    }
}

/// The length of the content in an opened inner plaintext: what precedes its content type
/// (the last nonzero byte; zeros after it are padding).
fn content_len(inner: &[u8]) -> io::Result<usize> {
    let Some(at) = inner.iter().rposition(|&b| b != 0) else {
        return Err(invalid("a TLS record without a content type arrived: the peer is not speaking TLS 1.3"));
    };
    match inner[at] {
        APPLICATION_DATA => Ok(at),
        // close_notify (alert 0) is a clean end of the stream.
        ALERT if inner.get(1) == Some(&0) => Ok(usize::MAX),
        ALERT => Err(invalid(format!("the peer sent TLS alert {}", inner.get(1).copied().unwrap_or(0)))),
        other => Err(invalid(format!(
            "the peer sent a TLS record of content type {other} after the handshake, which the ring does not take \
             (it supports no key update)"
        ))),
    }
}

/// A link after the TLS handshake, reading and writing TLS 1.3 records; see the module docs.
pub(crate) struct Sealed {
    sock: TcpStream,
    tx: DirectionKeys,
    rx: DirectionKeys,
    /// Sealed records not yet written: `out[out_pos..out_len]`.
    out: Vec<u8>,
    out_pos: usize,
    out_len: usize,
    /// Received ciphertext not yet opened: `inbuf[in_start..in_end]`.
    inbuf: Vec<u8>,
    in_start: usize,
    in_end: usize,
    /// The content of a record the reader's buffer could not take whole: `spill[spill_pos..spill_len]`.
    spill: Vec<u8>,
    spill_pos: usize,
    spill_len: usize,
    /// The peer sent close_notify.
    closed: bool,
}

impl std::fmt::Debug for Sealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealed").field("sock", &self.sock).finish_non_exhaustive()
    }
}

impl Sealed {
    /// The link with the traffic secrets rustls extracted after the handshake, as (sequence
    /// number, secrets) for sending and for receiving, and where their later keys come from.
    pub(crate) fn new(
        sock: TcpStream,
        tx: (u64, ConnectionTrafficSecrets),
        rx: (u64, ConnectionTrafficSecrets),
        (tx_rekey, rx_rekey): (Rekey, Rekey),
    ) -> Result<Sealed, String> {
        Ok(Sealed {
            sock,
            tx: DirectionKeys::new(tx, tx_rekey)?,
            rx: DirectionKeys::new(rx, rx_rekey)?,
            out: Vec::new(),
            out_pos: 0,
            out_len: 0,
            inbuf: Vec::new(),
            in_start: 0,
            in_end: 0,
            spill: Vec::new(),
            spill_pos: 0,
            spill_len: 0,
            closed: false,
        })
    }

    pub(crate) fn tcp(&self) -> &TcpStream {
        &self.sock
    }

    /// Moves to the next key every `sent` records sent and every `received` received.
    #[cfg(test)]
    pub(crate) fn rekey_every(&mut self, sent: u64, received: u64) {
        (self.tx.rekey.every, self.rx.rekey.every) = (sent, received);
    }

    /// Writes out the sealed records; `Ok(false)` when the socket is full.
    pub(crate) fn flush_out(&mut self) -> io::Result<bool> {
        while self.out_pos < self.out_len {
            match self.sock.write(&self.out[self.out_pos..self.out_len]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// The body length of the whole record at the front of `inbuf`, once it has arrived.
    fn next_record(&self) -> io::Result<Option<usize>> {
        let have = &self.inbuf[self.in_start..self.in_end];
        let Some(header) = have.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let len = u16::from_be_bytes([header[3], header[4]]) as usize;
        if header[0] != APPLICATION_DATA
            || header[1..3] != LEGACY_VERSION[..]
            || !(TAG_LEN + 1..=MAX_CIPHERTEXT).contains(&len)
        {
            return Err(invalid(format!(
                "bytes that are not a TLS 1.3 record arrived (header {header:02x?}): the peer is out of step"
            )));
        }
        Ok((have.len() >= HEADER_LEN + len).then_some(len))
    }

    /// Opens the record at the front of `inbuf` (body `len` bytes) into `dst`, which must be
    /// `len - TAG_LEN` bytes; returns its content length (`usize::MAX` for close_notify).
    fn open_into(&mut self, len: usize, dst: &mut [u8]) -> io::Result<usize> {
        let record = &self.inbuf[self.in_start..self.in_start + HEADER_LEN + len];
        let (header, body) = record.split_at(HEADER_LEN);
        let (sealed, tag) = body.split_at(len - TAG_LEN);
        let nonce = self.rx.nonce()?;
        self.rx.key.open_separate_gather(nonce, Aad::from(header), sealed, tag, dst).map_err(|_| {
            invalid("a TLS record failed authentication: it was altered on the way, or the peer is out of step")
        })?;
        self.in_start += HEADER_LEN + len;
        content_len(dst)
    }

    /// Opens whole records that have arrived into `buf`, straight where their bytes belong
    /// while a record's inner plaintext fits; a record that does not fit goes through `spill`.
    fn open_records(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        while let Some(len) = self.next_record()? {
            let inner = len - TAG_LEN;
            let got = if inner <= buf.len() - n {
                self.open_into(len, &mut buf[n..n + inner])?
            } else if n == 0 {
                let mut spill = std::mem::take(&mut self.spill);
                spill.resize(spill.len().max(inner), 0);
                let got = self.open_into(len, &mut spill[..inner]);
                self.spill = spill;
                let got = got?;
                if got != usize::MAX {
                    let give = got.min(buf.len());
                    buf[..give].copy_from_slice(&self.spill[..give]);
                    (self.spill_pos, self.spill_len) = (give, got);
                    return Ok(give);
                }
                got
            } else {
                break;
            };
            if got == usize::MAX {
                self.closed = true;
                break;
            }
            n += got;
            if n == buf.len() {
                break;
            }
        }
        Ok(n)
    }

    /// Reads more ciphertext; `Ok(false)` at the end of the stream.
    fn receive(&mut self) -> io::Result<bool> {
        if self.inbuf.is_empty() {
            self.inbuf.resize(RX_BYTES, 0);
        }
        if self.in_start == self.in_end {
            (self.in_start, self.in_end) = (0, 0);
        }
        // Keep room for a whole record behind what is left of a partial one.
        if self.inbuf.len() - self.in_end < HEADER_LEN + MAX_CIPHERTEXT {
            self.inbuf.copy_within(self.in_start..self.in_end, 0);
            (self.in_start, self.in_end) = (0, self.in_end - self.in_start);
        }
        loop {
            match self.sock.read(&mut self.inbuf[self.in_end..]) {
                Ok(0) if self.in_start < self.in_end => {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the link closed inside a TLS record"));
                }
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.in_end += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl Read for Sealed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.spill_pos < self.spill_len {
            let give = (self.spill_len - self.spill_pos).min(buf.len());
            buf[..give].copy_from_slice(&self.spill[self.spill_pos..self.spill_pos + give]);
            self.spill_pos += give;
            return Ok(give);
        }
        loop {
            if self.closed {
                return Ok(0);
            }
            let n = self.open_records(buf)?;
            if n > 0 {
                return Ok(n);
            }
            if !self.closed && !self.receive()? {
                return Ok(0);
            }
        }
    }
}

/// Seals up to [`SEAL_BATCH_BYTES`] in records from `buf` and returns how many bytes they carry; a
/// write while earlier records are still unsent returns `WouldBlock`, so the caller waits for
/// the socket ([`Sealed::flush_out`] sends the rest).
impl Write for Sealed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !self.flush_out()? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let take = buf.len().min(SEAL_BATCH_BYTES);
        let need = take + take.div_ceil(MAX_PLAINTEXT) * OVERHEAD;
        if self.out.len() < need {
            self.out.resize(need, 0);
        }
        let mut at = 0;
        for bytes in buf[..take].chunks(MAX_PLAINTEXT) {
            self.tx.seal(bytes, &mut self.out[at..at + bytes.len() + OVERHEAD])?;
            at += bytes.len() + OVERHEAD;
        }
        (self.out_pos, self.out_len) = (0, at);
        self.flush_out()?;
        Ok(take)
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.flush_out()? {
            true => Ok(()),
            false => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}
