//! `.npz` archives: a zip of `.npy` members. A stored member is mapped in place, at its offset
//! in the archive, so no byte is copied. A deflated member (`np.savez_compressed`) cannot be
//! mapped, so it is inflated once into an unlinked temporary file (in the system temporary
//! folder) and mapped from there: that keeps arrays larger than RAM working at the cost of
//! their size on disk while open.
//!
//! Every member's CRC-32 is checked at open, stored or deflated, as NumPy does: a flipped byte
//! in a float array still parses, and trained to a loss of 2.4e36 before this check. It reads
//! the array once (crc32fast runs at several GB/s, far below a first epoch's cost).

use super::{NpyArray, map_file};
use crate::data::error::{DataError, Position, UnknownName};
use memmap2::Mmap;
use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;
use zip::{CompressionMethod, ZipArchive};

/// An open `.npz` archive.
pub(super) struct Npz<'p> {
    path: &'p Path,
    map: Arc<Mmap>,
}

impl<'p> Npz<'p> {
    /// Maps the archive.
    pub(super) fn open(path: &'p Path) -> Result<Self, DataError> {
        Ok(Self { path, map: Arc::new(map_file(path)?) })
    }

    /// The member `name` (or `name.npy`) as an array.
    pub(super) fn member(&self, name: &str) -> Result<NpyArray, DataError> {
        // The central directory is parsed again per member: microseconds, and it keeps the
        // archive from borrowing the map it reads.
        let zip_error = |source| DataError::Zip { path: self.path.to_path_buf(), source };
        let mut archive = ZipArchive::new(Cursor::new(&self.map[..])).map_err(zip_error)?;
        open_member(self.path, &self.map, &mut archive, name)
    }
}

fn open_member(
    path: &Path,
    map: &Arc<Mmap>,
    archive: &mut ZipArchive<Cursor<&[u8]>>,
    name: &str,
) -> Result<NpyArray, DataError> {
    let zip_error = |source| DataError::Zip { path: path.to_path_buf(), source };
    let member = [format!("{name}.npy"), name.to_string()]
        .into_iter()
        .find(|candidate| archive.index_for_name(candidate).is_some())
        .ok_or_else(|| {
            DataError::UnknownName(Box::new(UnknownName {
                path: path.to_path_buf(),
                at: None,
                what: "array",
                name: name.to_string(),
                available: archive
                    .file_names()
                    .filter_map(Result::ok)
                    .map(|n| n.trim_end_matches(".npy").to_string())
                    .collect(),
            }))
        })?;
    let member_path = path.join(&member);
    // Raw: a deflated member is inflated below, not by the zip crate's reader, whose CRC
    // failure names neither checksum.
    let index = archive.index_for_name(&member).ok_or(zip::result::ZipError::FileNotFound).map_err(zip_error)?;
    let mut file = archive.by_index_raw(index).map_err(zip_error)?;
    let method = file.compression();
    if method == CompressionMethod::Stored {
        let start = file.data_start().ok_or_else(|| {
            zip_error(zip::result::ZipError::InvalidArchive(format!("no data offset for {member}").into()))
        })? as usize;
        // A damaged directory may claim any size; `from_map` then finds the bytes missing.
        let end = start.saturating_add(file.size() as usize);
        if let Some(bytes) = map.get(start..end) {
            check_crc(path, &member, file.crc32(), bytes)?;
        }
        return NpyArray::from_map(member_path, Arc::clone(map), start..end);
    }
    if method != CompressionMethod::Deflated {
        return Err(DataError::Unsupported {
            path: member_path,
            what: format!(
                "compression {method}; NumPy writes stored (np.savez) or deflated (np.savez_compressed) members"
            ),
        });
    }
    let temp_error = |source| DataError::Read { path: std::env::temp_dir(), source };
    let expected = file.crc32();
    let mut temp = flate2::CrcWriter::new(tempfile::tempfile().map_err(temp_error)?);
    std::io::copy(&mut flate2::read::DeflateDecoder::new(&mut file), &mut temp).map_err(|e| DataError::Malformed {
        path: member_path.clone(),
        at: Position::File,
        problem: format!("cannot inflate it into a temporary file: {e}"),
    })?;
    if temp.crc().sum() != expected {
        return Err(crc_error(path, &member, expected, temp.crc().sum()));
    }
    let temp = temp.into_inner();
    // SAFETY: the temporary file is unlinked and this process's alone; nothing else can
    // truncate it while it is mapped.
    let inflated = unsafe { Mmap::map(&temp) }.map_err(temp_error)?;
    let len = inflated.len();
    NpyArray::from_map(member_path, Arc::new(inflated), 0..len)
}

/// `Ok` when `bytes` have the CRC-32 the archive's directory records for `member`.
fn check_crc(path: &Path, member: &str, expected: u32, bytes: &[u8]) -> Result<(), DataError> {
    let mut crc = flate2::Crc::new();
    crc.update(bytes);
    match crc.sum() {
        found if found == expected => Ok(()),
        found => Err(crc_error(path, member, expected, found)),
    }
}

fn crc_error(path: &Path, member: &str, expected: u32, found: u32) -> DataError {
    DataError::MemberCrc { path: path.to_path_buf(), member: member.to_string(), expected, found }
}
