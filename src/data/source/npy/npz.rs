//! `.npz` archives: a zip of `.npy` members. A stored member is mapped in place, at its offset
//! in the archive, so no byte is copied. A deflated member (`np.savez_compressed`) cannot be
//! mapped, so it is inflated once into an unlinked temporary file (in the system temporary
//! folder; the zip crate checks its CRC while inflating) and mapped from there: that keeps
//! arrays larger than RAM working at the cost of their size on disk while open.
//!
//! The CRC of a stored member is not checked: that would read the whole array at open; a
//! damaged member still fails on its `.npy` header or size.

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
    let mut file = archive.by_name(&member).map_err(zip_error)?;
    let method = file.compression();
    if method == CompressionMethod::Stored {
        let start = file.data_start().ok_or_else(|| {
            zip_error(zip::result::ZipError::InvalidArchive(format!("no data offset for {member}").into()))
        })? as usize;
        // A damaged directory may claim any size; `from_map` then finds the bytes missing.
        let end = start.saturating_add(file.size() as usize);
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
    let mut temp = tempfile::tempfile().map_err(temp_error)?;
    std::io::copy(&mut file, &mut temp).map_err(|e| DataError::Malformed {
        path: member_path.clone(),
        at: Position::File,
        problem: format!("cannot inflate it into a temporary file: {e}"),
    })?;
    // SAFETY: the temporary file is unlinked and this process's alone; nothing else can
    // truncate it while it is mapped.
    let inflated = unsafe { Mmap::map(&temp) }.map_err(temp_error)?;
    let len = inflated.len();
    NpyArray::from_map(member_path, Arc::new(inflated), 0..len)
}
