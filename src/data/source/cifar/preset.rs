//! The CIFAR presets: the official archive of each dataset, its checksum, and unpacking it.
//! The archive is downloaded by the shared [`Fetcher`] (mirrors, temporary file, checksum,
//! rename), then unpacked into a temporary folder beside its final place and its `.bin` files
//! moved into place one by one, so an interrupted unpack never leaves a half-written file
//! under a real name. The archive is deleted once unpacked.

use super::{CifarDataset, CifarSplit};
use crate::data::download::{Checksum, Fetcher, RemoteFile};
use crate::data::error::DataError;
use crate::data::formats::io_error;
use flate2::read::GzDecoder;
use std::fs::{self, File};
use std::io::BufReader;
use std::path::{Path, PathBuf};

/// Alex Krizhevsky's page, the only official host (https://www.cs.toronto.edu/~kriz/cifar.html).
const MIRRORS: &[&str] = &["https://www.cs.toronto.edu/~kriz/"];

/// Where a CIFAR dataset comes from and where its files land.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CifarPreset {
    pub dataset: CifarDataset,
    /// The `.tar.gz` on the mirrors, with its checksum.
    pub archive: RemoteFile,
    /// The folder the archive unpacks to; the `.bin` files are in it.
    pub folder: &'static str,
    /// Base URLs, tried in order.
    pub mirrors: &'static [&'static str],
}

impl CifarPreset {
    /// The official binary archive of `dataset`.
    pub fn of(dataset: CifarDataset) -> Self {
        // SHA-256 of the archives as served: TensorFlow Datasets' `url_checksums/cifar10.txt`
        // and `cifar100.txt` (170,052,171 and 168,513,733 bytes). The CIFAR page publishes
        // MD5s that name the same files: c32a1d4ab5d03f1284b67883e8d87530 (CIFAR-10 binary)
        // and 03b5dce01913d631647c71ecec9e9cb8 (CIFAR-100 binary).
        let (name, sha256, folder) = match dataset {
            CifarDataset::Cifar10 => (
                "cifar-10-binary.tar.gz",
                "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd",
                "cifar-10-batches-bin",
            ),
            CifarDataset::Cifar100 { .. } => (
                "cifar-100-binary.tar.gz",
                "58a81ae192c23a4be8b1804d68e518ed807d710a4eb253b1f2a199162a40d8ec",
                "cifar-100-binary",
            ),
        };
        let archive = RemoteFile { name: name.into(), checksum: Checksum::Sha256File(sha256.into()) };
        Self { dataset, archive, folder, mirrors: MIRRORS }
    }

    /// The folder holding the `.bin` files under the data folder `dir`.
    pub fn files_dir(&self, dir: &Path) -> PathBuf {
        dir.join(self.folder)
    }

    /// The `.bin` files (both splits) not yet under `dir`.
    pub fn missing_files(&self, dir: &Path) -> Vec<String> {
        let files_dir = self.files_dir(dir);
        [CifarSplit::Train, CifarSplit::Test]
            .into_iter()
            .flat_map(|split| self.dataset.files(split))
            .filter(|f| !files_dir.join(f).is_file())
            .collect()
    }

    /// Downloads and unpacks the archive when any `.bin` file is missing; returns the folder
    /// holding them.
    pub fn fetch_missing(&self, dir: &Path, fetcher: &Fetcher) -> Result<PathBuf, DataError> {
        let files_dir = self.files_dir(dir);
        if self.missing_files(dir).is_empty() {
            return Ok(files_dir);
        }
        let archive = fetcher.download(self.dataset.name(), dir, &[&self.archive], self.mirrors)?;
        let archive = archive.first().cloned().unwrap_or_else(|| dir.join(&self.archive.name));
        self.unpack(&archive, dir)?;
        let missing = self.missing_files(dir);
        if !missing.is_empty() {
            return Err(DataError::MissingFiles { dataset: self.dataset.name(), dir: files_dir, files: missing });
        }
        // The archive is 170 MB of what is now on disk twice; a failed removal only wastes space.
        let _ = fs::remove_file(&archive);
        Ok(files_dir)
    }

    /// Unpacks `archive` into a temporary folder under `dir`, then moves each missing `.bin`
    /// file into place.
    fn unpack(&self, archive: &Path, dir: &Path) -> Result<(), DataError> {
        let temp = dir.join(format!(".{}.{}.part", self.folder, std::process::id()));
        let result = self.unpack_into(archive, &temp, dir);
        // The temporary folder goes whatever happened; leftovers would only waste space.
        let _ = fs::remove_dir_all(&temp);
        result
    }

    fn unpack_into(&self, archive: &Path, temp: &Path, dir: &Path) -> Result<(), DataError> {
        let file = File::open(archive).map_err(io_error(archive))?;
        // `unpack` refuses entries that would land outside `temp` (`..`, absolute paths).
        tar::Archive::new(GzDecoder::new(BufReader::new(file))).unpack(temp).map_err(|source| DataError::Gzip {
            path: archive.to_path_buf(),
            source,
            downloaded: true,
        })?;
        let files_dir = self.files_dir(dir);
        fs::create_dir_all(&files_dir).map_err(io_error(&files_dir))?;
        for name in self.missing_files(dir) {
            let from = temp.join(self.folder).join(&name);
            if from.is_file() {
                let to = files_dir.join(&name);
                fs::rename(&from, &to).map_err(io_error(&to))?;
            }
        }
        Ok(())
    }
}
