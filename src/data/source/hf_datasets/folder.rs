//! What `save_to_disk` writes, found: a `DatasetDict` folder (`dataset_dict.json`, whose
//! `splits` name one folder each) or a `Dataset` folder (`state.json`, whose `_data_files` name
//! its Arrow files in order, beside `dataset_info.json`). What is missing is named, file by
//! file; a split the dict does not have names the ones it has.

use super::HfDatasetsConfig;
use crate::data::error::DataError;
use crate::data::source::columnar::Columnar;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The `DatasetDict` split trained on when `data.hf_datasets.train` is not set.
pub(super) const TRAIN: &str = "train";
const DICT: &str = "dataset_dict.json";
const STATE: &str = "state.json";
const INFO: &str = "dataset_info.json";

/// `dataset_dict.json`.
#[derive(Deserialize)]
struct DatasetDict {
    splits: Vec<String>,
}

/// The part of `state.json` that names the Arrow files.
#[derive(Deserialize)]
struct State {
    #[serde(rename = "_data_files")]
    data_files: Vec<DataFile>,
}

#[derive(Deserialize)]
struct DataFile {
    filename: String,
}

/// The Arrow files of the training and validation splits, in order.
pub(super) struct SplitFiles {
    pub train: Vec<PathBuf>,
    pub validation: Vec<PathBuf>,
}

/// What the folder is, as the files there tell.
enum FolderKind {
    /// `dataset_dict.json`: one folder per split.
    Dict,
    /// `state.json`: one split, the folder itself.
    One,
    /// Neither.
    Neither,
}

fn layout(dir: &Path) -> FolderKind {
    match (dir.join(DICT).is_file(), dir.join(STATE).is_file()) {
        (true, _) => FolderKind::Dict,
        (false, true) => FolderKind::One,
        (false, false) => FolderKind::Neither,
    }
}

/// The folders of the splits the config names (train first), relative to `dir`; `""` is `dir`.
/// A split a `DatasetDict` does not have is an error naming those it has.
fn split_dirs(dir: &Path, config: &HfDatasetsConfig) -> Result<Vec<String>, DataError> {
    match layout(dir) {
        FolderKind::Dict => {
            let train = config.train.clone().unwrap_or_else(|| TRAIN.into());
            let splits: Vec<String> = [Some(train), config.validation.clone()].into_iter().flatten().collect();
            let path = dir.join(DICT);
            let dict: DatasetDict = read_json(&path)?;
            match splits.iter().find(|s| !dict.splits.contains(s)) {
                Some(unknown) => Err(Columnar::HfDatasets.bad(format!(
                    "{} has no split `{unknown}`; its splits: {}",
                    path.display(),
                    dict.splits.join(", ")
                ))),
                None => Ok(splits),
            }
        }
        FolderKind::One => match (&config.train, &config.validation) {
            (None, None) => Ok(vec![String::new()]),
            (Some(_), _) | (_, Some(_)) => Err(Columnar::HfDatasets.bad(format!(
                "{} is one Dataset ({STATE}), not a DatasetDict: it has no splits to name; remove \
                 data.hf_datasets.train and data.hf_datasets.validation, or save a DatasetDict",
                dir.display()
            ))),
        },
        FolderKind::Neither => Ok(vec![]),
    }
}

/// Files `save_to_disk` writes that are not in `dir`, relative to it.
pub(super) fn missing(dir: &Path, config: &HfDatasetsConfig) -> Vec<String> {
    if let FolderKind::Neither = layout(dir) {
        return vec![format!(
            "{DICT} or {STATE} (not a folder Hugging Face datasets' save_to_disk wrote: a DatasetDict has \
             {DICT}, a Dataset {STATE})"
        )];
    }
    let mut missing = vec![];
    // A split-name error is the error of `split_files`, with the splits there.
    for split in split_dirs(dir, config).unwrap_or_default() {
        let here = dir.join(&split);
        let name = |file: &str| Path::new(&split).join(file).display().to_string();
        for file in [STATE, INFO] {
            if !here.join(file).is_file() {
                missing.push(name(file));
            }
        }
        if let Ok(state) = read_state(&here) {
            let absent = state.data_files.iter().filter(|f| !here.join(&f.filename).is_file());
            missing.extend(absent.map(|f| name(&f.filename)));
        }
    }
    missing
}

/// The Arrow files of the training split and of the validation split (none when not named).
pub(super) fn split_files(dir: &Path, config: &HfDatasetsConfig) -> Result<SplitFiles, DataError> {
    let splits = split_dirs(dir, config)?;
    let files = |split: &String| -> Result<Vec<PathBuf>, DataError> {
        let here = dir.join(split);
        Ok(read_state(&here)?.data_files.into_iter().map(|f| here.join(f.filename)).collect())
    };
    let mut each = splits.iter().map(files);
    let train = each.next().unwrap_or(Ok(vec![]))?;
    let validation = each.next().unwrap_or(Ok(vec![]))?;
    if train.is_empty() {
        let state = dir.join(splits.first().map_or("", String::as_str)).join(STATE);
        return Err(Columnar::HfDatasets.bad(format!("{} names no Arrow file", state.display())));
    }
    Ok(SplitFiles { train, validation })
}

fn read_state(split: &Path) -> Result<State, DataError> {
    read_json(&split.join(STATE))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, DataError> {
    let text = std::fs::read_to_string(path).map_err(|source| DataError::Read { path: path.to_path_buf(), source })?;
    serde_json::from_str(&text)
        .map_err(|e| Columnar::HfDatasets.bad(format!("{}: not what save_to_disk writes: {e}", path.display())))
}

/// The Arrow files of `path` given to `predict --input`: the files a `Dataset` folder's
/// `state.json` names, in order, or `path` itself when it is a file. A `DatasetDict` folder
/// holds several splits, so one is asked for, naming them.
pub(super) fn input_files(path: &Path) -> Result<Vec<PathBuf>, DataError> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let unreadable = |problem: String| DataError::Unsupported { path: path.to_path_buf(), what: problem };
    match layout(path) {
        FolderKind::One => {
            let files: Vec<PathBuf> = read_state(path)?.data_files.into_iter().map(|f| path.join(f.filename)).collect();
            match files.is_empty() {
                true => Err(unreadable(format!("its {STATE} names no Arrow file; give a folder save_to_disk wrote"))),
                false => Ok(files),
            }
        }
        FolderKind::Dict => {
            let dict: DatasetDict = read_json(&path.join(DICT))?;
            let each: Vec<String> = dict.splits.iter().map(|s| path.join(s).display().to_string()).collect();
            Err(unreadable(format!(
                "a DatasetDict holds several splits ({}); give one split's folder: {}",
                dict.splits.join(", "),
                each.join(" or ")
            )))
        }
        FolderKind::Neither => Err(unreadable(format!(
            "a folder without {STATE} or {DICT} is not one Hugging Face datasets' save_to_disk wrote; give a \
             Dataset's folder (one split, with {STATE}) or one of its .arrow files"
        ))),
    }
}
