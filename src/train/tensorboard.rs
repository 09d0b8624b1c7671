//! TensorBoard event files, written directly: no maintained crate writes them, and the format
//! is small. A file is a sequence of records (length, masked CRC-32C of the length, payload,
//! masked CRC-32C of the payload); each payload is an `Event` protobuf whose first instance
//! says `file_version = "brain.Event:2"`. Scalars are `Summary.Value.simple_value`, which
//! every TensorBoard reads.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Appends scalar events to one TensorBoard event file.
pub struct EventWriter {
    path: PathBuf,
    file: BufWriter<File>,
}

impl EventWriter {
    /// Creates `dir` and a new event file in it, named as TensorFlow names them so that
    /// TensorBoard finds it (`events.out.tfevents.<seconds>.<host>.<pid>`).
    pub fn create(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let now = SystemTime::now();
        let host = crate::provenance::hostname().unwrap_or_else(|| "localhost".to_string());
        let host: String = host.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        let secs = crate::provenance::unix_seconds(now) as u64;
        let name = format!("events.out.tfevents.{secs}.{host}.{}", std::process::id());
        // A resident sweep trial (one process) may start its next rung's file within the same
        // second: it gets a suffix instead of overwriting the rung before.
        let (mut path, mut n) = (dir.join(&name), 0);
        let file = loop {
            match File::options().write(true).create_new(true).open(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => {
                    n += 1;
                    path = dir.join(format!("{name}.{n}"));
                }
                opened => break opened?,
            }
        };
        let mut writer = Self { file: BufWriter::new(file), path };
        writer.write(&file_version_event(crate::provenance::unix_seconds(now)))?;
        Ok(writer)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes one event holding `scalars` (tag, value) at `step`, and flushes it, so a killed
    /// run keeps its curves.
    pub fn scalars(&mut self, step: u64, scalars: &[(&str, f64)]) -> std::io::Result<()> {
        let wall_time = crate::provenance::unix_seconds(SystemTime::now());
        self.write(&scalar_event(wall_time, step, scalars))
    }

    fn write(&mut self, event: &[u8]) -> std::io::Result<()> {
        self.file.write_all(&record(event))?;
        self.file.flush()
    }
}

/// TFRecord's checksum: CRC-32C, rotated and offset so that a CRC of data holding CRCs stays
/// well distributed.
pub fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One record of an event file.
fn record(payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(payload.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(&masked_crc(payload).to_le_bytes());
    out
}

// Protobuf wire format, just what `Event` needs.
// Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string), summary = 5.
// Summary: value = 1 (repeated). Summary.Value: tag = 1 (string), simple_value = 2 (float).

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

fn bytes(out: &mut Vec<u8>, field: u32, data: &[u8]) {
    key(out, field, 2);
    varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

fn wall_time(out: &mut Vec<u8>, t: f64) {
    key(out, 1, 1);
    out.extend_from_slice(&t.to_le_bytes());
}

fn file_version_event(t: f64) -> Vec<u8> {
    let mut out = Vec::new();
    wall_time(&mut out, t);
    bytes(&mut out, 3, b"brain.Event:2");
    out
}

fn scalar_event(t: f64, step: u64, scalars: &[(&str, f64)]) -> Vec<u8> {
    let mut summary = Vec::new();
    for (tag, v) in scalars {
        let mut value = Vec::new();
        bytes(&mut value, 1, tag.as_bytes());
        key(&mut value, 2, 5);
        value.extend_from_slice(&(*v as f32).to_le_bytes());
        bytes(&mut summary, 1, &value);
    }
    let mut out = Vec::new();
    wall_time(&mut out, t);
    if step != 0 {
        key(&mut out, 2, 0);
        varint(&mut out, step);
    }
    bytes(&mut out, 5, &summary);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn masked_crcs_match_tensorflow() {
        // CRC-32C's check value, and TensorBoard's `masked_crc32c(b"123456789")`.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc(b"123456789"), 0xc78a_b0e5);
    }

    /// Bytes written by TensorBoard's own `Event.SerializeToString` and `RecordWriter`.
    #[test]
    fn events_match_tensorboards_encoding() {
        let version = file_version_event(1.5);
        assert_eq!(hex(&version), "09000000000000f83f1a0d627261696e2e4576656e743a32");
        assert_eq!(
            hex(&record(&version)),
            "1800000000000000a37f4b2209000000000000f83f1a0d627261696e2e4576656e743a322a28646c"
        );
        let scalar = scalar_event(1.5, 3, &[("epoch_loss", 0.25)]);
        assert_eq!(hex(&scalar), "09000000000000f83f10032a130a110a0a65706f63685f6c6f7373150000803e");
        assert_eq!(
            hex(&record(&scalar)),
            "200000000000000029eda95009000000000000f83f10032a130a110a0a65706f63685f6c6f7373150000803ef419eac0"
        );
    }

    #[test]
    fn varints_use_seven_bits_a_byte() {
        let enc = |v: u64| {
            let mut out = Vec::new();
            varint(&mut out, v);
            hex(&out)
        };
        assert_eq!(enc(1), "01");
        assert_eq!(enc(300), "ac02");
        assert_eq!(enc(u64::MAX), "ffffffffffffffffff01");
    }
}
