//! [`DataError`]: everything that can go wrong reading, downloading or batching data. Each
//! message names the file or value at fault and, where there is one, the fix.

use std::fmt;
use std::path::PathBuf;

/// A failure in the data module. The text is part of the contract: tests snapshot it.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be opened or read.
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The file starts like gzip but does not decompress.
    #[error("{}: corrupt gzip data ({source}); {}", .path.display(), damaged_fix(*.downloaded))]
    Gzip {
        path: PathBuf,
        #[source]
        source: std::io::Error,
        /// Whether trainrun fetches the file itself, so fetching it again is the fix.
        downloaded: bool,
    },

    /// The first two bytes of an IDX file must be zero.
    #[error(
        "{}: not an IDX file (it must start with the bytes 00 00, found {:02x} {:02x})",
        .path.display(), .found[0], .found[1]
    )]
    BadMagic { path: PathBuf, found: [u8; 2] },

    /// Only unsigned-byte IDX files are read.
    #[error(
        "{}: IDX element type 0x{code:02x} ({}) is not supported; only unsigned bytes (0x08) are",
        .path.display(), idx_type_name(*.code)
    )]
    UnsupportedType { path: PathBuf, code: u8 },

    /// The header's dimensions do not fit what the file is used for.
    #[error("{}: the header gives dimensions {dims:?}; {expected}", .path.display())]
    BadDims { path: PathBuf, dims: Vec<usize>, expected: String },

    /// The file holds fewer bytes than its header describes.
    #[error(
        "{}: truncated: the header describes {expected} bytes, the file holds {found}; {}",
        .path.display(), damaged_fix(*.downloaded)
    )]
    Truncated { path: PathBuf, expected: u64, found: u64, downloaded: bool },

    /// The file holds more bytes than its header describes.
    #[error(
        "{}: {found} bytes, but the header describes {expected}; is it the right file?",
        .path.display()
    )]
    TrailingBytes { path: PathBuf, expected: u64, found: u64 },

    /// Image and label files disagree on the number of examples.
    #[error(
        "{} holds {images} images but {} holds {labels} labels; they must be the same split",
        .images_path.display(), .labels_path.display()
    )]
    CountMismatch { images_path: PathBuf, images: usize, labels_path: PathBuf, labels: usize },

    /// A label is not a valid class of the dataset.
    #[error(
        "{}: label {label} of example {index} is outside the {classes} classes of {dataset}",
        .path.display()
    )]
    LabelOutOfRange { path: PathBuf, dataset: &'static str, index: usize, label: u8, classes: u32 },

    /// Files of a dataset are not in its folder (and were not downloaded).
    #[error(
        "{dataset}: missing in {}: {}; put the files there, or set `data.dir` \
         (or TRAINRUN_DATA_DIR) to a folder that has them",
        .dir.display(), .files.join(", ")
    )]
    MissingFiles { dataset: &'static str, dir: PathBuf, files: Vec<String> },

    /// Every mirror failed for at least one file.
    #[error("{}", DownloadReport { dataset, dir, failures })]
    DownloadFailed { dataset: &'static str, dir: PathBuf, failures: Vec<FileFailure> },

    /// No folder could be chosen for a dataset that lives in files.
    #[error(
        "{dataset}: no data folder: set `data.dir` or TRAINRUN_DATA_DIR \
         (neither XDG_CACHE_HOME nor HOME is set, so there is no cache folder either)"
    )]
    NoDataDir { dataset: &'static str },

    /// A spec section the dataset needs is absent.
    #[error("`data.dataset = \"{dataset}\"` needs `{section}`; example: {example}")]
    MissingSection { dataset: &'static str, section: &'static str, example: &'static str },

    /// `[data.synthetic]` asks for something that cannot be generated.
    #[error("data.synthetic: {problem}")]
    BadSynthetic { problem: String },

    /// `[data.jsonl]` asks for something that cannot be read.
    #[error("data.jsonl: {problem}")]
    BadJsonl { problem: String },

    /// `[data.parquet]` asks for something the files cannot give (a missing column, a column
    /// of another type).
    #[error("data.parquet: {problem}")]
    BadParquet { problem: String },

    /// A file that is not readable Parquet: a truncated footer, a corrupt page.
    #[error("{}: not a readable Parquet file: {detail}", .path.display())]
    ParquetUnreadable { path: PathBuf, detail: String },

    /// `[data.hf_datasets]` asks for something the folder cannot give (a split it lacks, a
    /// missing column, a column of another type).
    #[error("data.hf_datasets: {problem}")]
    BadHfDatasets { problem: String },

    /// An Arrow file of a `save_to_disk` folder that cannot be read: truncated, or not an
    /// Arrow IPC stream.
    #[error("{}: not a readable Arrow stream file: {detail}", .path.display())]
    ArrowUnreadable { path: PathBuf, detail: String },

    /// `[data.preprocessing]` does not fit the data as loaded (the plan checked its headers).
    #[error("data.preprocessing: {problem}")]
    BadPreprocessing { problem: String },

    /// The training split has no examples, so no batch can ever be made.
    #[error("the training set is empty; check the data files")]
    EmptyTrainingSet,

    /// With `drop_remainder`, a global batch larger than the data gives no batch at all.
    #[error(
        "the global batch ({global_batch}) is larger than the {examples} training examples and \
         `data.drop_remainder = true` drops it whole; use a batch of at most {examples} or \
         `drop_remainder = false`"
    )]
    BatchLargerThanData { global_batch: usize, examples: usize },

    /// `data.prefetch` beyond any use.
    #[error("data.prefetch = {prefetch} is more than {max} batches ahead; 2 to 4 is plenty")]
    PrefetchTooLarge { prefetch: usize, max: usize },

    /// A shard index outside `0..count`.
    #[error("shard index {index} is out of range for {count} shards")]
    BadShard { index: usize, count: usize },

    /// A resume cursor that does not fit the dataset.
    #[error(
        "cursor offset {offset} is past the {examples} examples of the training set; \
         the checkpoint belongs to another dataset"
    )]
    BadCursor { offset: usize, examples: usize },

    /// The prefetch thread could not be started.
    #[error("cannot start the input pipeline thread: {source}")]
    Thread {
        #[source]
        source: std::io::Error,
    },

    /// The prefetch thread ended without being asked to.
    #[error("the input pipeline thread stopped unexpectedly")]
    PipelineStopped,

    /// A file breaks its format at a known place.
    #[error("{}: {problem}", Located { path, at })]
    Malformed { path: PathBuf, at: Position, problem: String },

    /// A file is well formed but uses a feature trainrun does not read.
    #[error("{}: {what}", .path.display())]
    Unsupported { path: PathBuf, what: String },

    /// A TFRecord's stored CRC-32C does not match its bytes.
    #[error(
        "{}: the record at byte {offset} fails its {part} checksum (stored {stored:#010x}, computed \
         {computed:#010x}); the file is corrupt",
        .path.display()
    )]
    BadCrc { path: PathBuf, offset: u64, part: &'static str, stored: u32, computed: u32 },

    /// A named column, array or feature is not in the file (boxed: the largest variant).
    #[error("{0}")]
    UnknownName(Box<UnknownName>),

    /// Features and labels disagree on the number of examples.
    #[error(
        "{} holds {features} examples but {} holds {labels} labels; there must be one label per example",
        .features_path.display(), .labels_path.display()
    )]
    LengthMismatch { features_path: PathBuf, features: usize, labels_path: PathBuf, labels: usize },

    /// An image file does not decode.
    #[error("cannot decode the image {}: {source}", .path.display())]
    Image {
        path: PathBuf,
        // Boxed: `ImageError` alone is 64 bytes, and every `Result` carrying a `DataError`
        // pays for its largest variant.
        #[source]
        source: Box<image::ImageError>,
    },

    /// An image folder holds no class folders.
    #[error(
        "{}: no class folders; image_folder expects <dir>/<split>/<class>/*.png|jpg|jpeg",
        .dir.display()
    )]
    NoClasses { dir: PathBuf },

    /// A class folder holds no image.
    #[error("{}: the class folder holds no .png, .jpg or .jpeg image; add images or remove it", .dir.display())]
    EmptyClass { dir: PathBuf },

    /// A folder link in a class folder that leads back into its own walk.
    #[error(
        "{}: a link to {}, {}; remove the link (links to folders elsewhere are followed)",
        .link.display(), .target.display(),
        if *.ancestor { "a folder that holds it, so reading it would loop" } else { "a folder already read, so its images would count twice" }
    )]
    FolderLoop { link: PathBuf, target: PathBuf, ancestor: bool },

    /// Two splits of an image folder name different classes.
    #[error("{} and {} must have the same class folders; {difference}", .first.display(), .second.display())]
    ClassesDiffer { first: PathBuf, second: PathBuf, difference: String },

    /// The test split's examples do not fit the model of the training split's.
    #[error(
        "{} (training) and {} (test) do not fit one model: {difference}; save both splits with the \
         same example shape and the same kind of labels",
        .train.display(), .test.display()
    )]
    SplitsDiffer { train: PathBuf, test: PathBuf, difference: String },

    /// A CSV file the `csv` crate cannot split into records.
    #[error("{}: {source}", .path.display())]
    Csv {
        path: PathBuf,
        #[source]
        source: csv::Error,
    },

    /// A CSV test table whose columns are not the training table's; `difference` names
    /// them (`missing `b`; extra `c``).
    #[error(
        "{}: its columns are not those of the training table {}: {difference}; the test table is \
         read by column name, so it needs every column of the training table (in any order) and \
         no other: fix its header, or list the columns to read in `data.csv.features`",
        .test.display(), .train.display()
    )]
    ColumnsDiffer { train: PathBuf, test: PathBuf, difference: String },

    /// A CSV test table with class names the training table does not have; `labels` says
    /// which and the training table's classes (`label column `y` holds `tiny` ... (its
    /// classes: big, small)`).
    #[error(
        "{}: {labels}; a model predicts only the classes it trained on: fix those labels, or add \
         examples of them to the training table; if the labels are numbers to predict, set \
         `data.csv.labels = \"regression\"`",
        .test.display()
    )]
    UnknownClasses { test: PathBuf, labels: String },

    /// A `.npz` file that is not a readable zip archive.
    #[error("{}: not a readable zip archive: {source}", .path.display())]
    Zip {
        path: PathBuf,
        #[source]
        source: zip::result::ZipError,
    },

    /// The files of a language model's split are all shorter than one window.
    #[error("{}", TooFew { dataset, split: *split, files, block: *block })]
    TooFewTokens {
        dataset: &'static str,
        split: crate::data::windows::WindowSplit,
        files: Vec<(PathBuf, usize)>,
        block: usize,
    },

    /// A `.npz` member whose bytes do not have the CRC-32 its archive records.
    #[error(
        "{}: member `{member}` fails its CRC-32 check (the archive records {expected:#010x}, its \
         bytes give {found:#010x}); the archive is corrupt and NumPy refuses it too: write it \
         again (np.savez or np.savez_compressed) or copy it again from where it was made",
        .path.display()
    )]
    MemberCrc { path: PathBuf, member: String, expected: u32, found: u32 },

    /// `[data.tfrecord]` cannot be used as written.
    #[error("data.tfrecord: {problem}")]
    BadTfRecord { problem: String },

    /// Files ended before the number of records counted when the run started.
    #[error(
        "{}: the files hold fewer than the {expected} records counted when the run started; were they changed during the run?",
        .files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    StreamEnded { files: Vec<PathBuf>, expected: usize },

    /// A split read only in order cannot be shuffled whole, nor sharded by file when it is
    /// not made of files.
    #[error("the input pipeline cannot {what}")]
    Unstreamable { what: &'static str },

    /// A reader was asked for an example it does not have.
    #[error("example {index} is out of range: the reader has {examples}")]
    ExampleOutOfRange { index: usize, examples: usize },

    /// A reader was given an output buffer of the wrong length.
    #[error("the output buffer holds {found} values, one example needs {expected}")]
    BufferLength { expected: usize, found: usize },
}

/// `missing `a`, `b`; extra `c``: what a test table lacks and has besides.
pub(crate) fn columns_differ(missing: &[String], extra: &[String]) -> String {
    let part = |what: &str, names: &[String]| (!names.is_empty()).then(|| format!("{what} {}", quoted(names)));
    [part("missing", missing), part("extra", extra)].into_iter().flatten().collect::<Vec<_>>().join("; ")
}

/// Names in backquotes, separated by commas.
pub(crate) fn quoted(names: &[String]) -> String {
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

impl DataError {
    /// The error, for a file trainrun fetches itself (a published dataset's): a damaged one
    /// is fixed by fetching it again, which for a user's own file would be harmful advice.
    pub fn downloaded(self) -> Self {
        match self {
            DataError::Gzip { path, source, .. } => DataError::Gzip { path, source, downloaded: true },
            DataError::Truncated { path, expected, found, .. } => {
                DataError::Truncated { path, expected, found, downloaded: true }
            }
            other => other,
        }
    }
}

/// The fix for a damaged file: fetching it again when trainrun fetches it, else remaking it.
fn damaged_fix(downloaded: bool) -> &'static str {
    match downloaded {
        true => "delete the file and fetch it again",
        false => "the file was cut short or damaged: copy or write it again from where it was made",
    }
}

/// Where in a file a problem is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    /// The file as a whole.
    File,
    /// Byte offset from the start (of the decompressed stream, for a gzip file).
    Byte(u64),
    /// 1-based line and column; in a CSV file the column is the 1-based field number.
    Line { line: u64, column: usize },
    /// 1-based line and column (in characters) and the byte offset of that column from the
    /// start (of the decompressed stream): a JSONL file, whose lines can be long.
    LineByte { line: u64, column: usize, byte: u64 },
    /// 0-based record (example) index.
    Record(usize),
}

/// A name looked up in a file and not found, with the names the file has.
#[derive(Debug)]
pub struct UnknownName {
    pub path: PathBuf,
    pub at: Option<Position>,
    /// What kind of name: `column`, `array`, `feature`.
    pub what: &'static str,
    pub name: String,
    pub available: Vec<String>,
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let located = Located { path: &self.path, at: self.at.as_ref().unwrap_or(&Position::File) };
        let (what, name, available) = (self.what, &self.name, &self.available);
        write!(
            f,
            "{located}: no {what} named `{name}`{}; it has: {}",
            did_you_mean(name, available),
            available.join(", ")
        )
    }
}

/// `path:line:column` for text, `path at byte N` or `path, record N` otherwise.
struct Located<'a> {
    path: &'a PathBuf,
    at: &'a Position,
}

impl fmt::Display for Located<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path.display();
        match self.at {
            Position::File => write!(f, "{path}"),
            Position::Byte(offset) => write!(f, "{path} at byte {offset}"),
            Position::Line { line, column } => write!(f, "{path}:{line}:{column}"),
            Position::LineByte { line, column, byte } => write!(f, "{path}:{line}:{column} (byte {byte})"),
            Position::Record(index) => write!(f, "{path}, record {index}"),
        }
    }
}

/// ` (did you mean `x`?)` when one of `available` is close enough to `name` to be a typo (the
/// threshold of the spec's suggestions, `spec::words::closest`, which is private to `spec`).
fn did_you_mean(name: &str, available: &[String]) -> String {
    let score = |a: &String| strsim::jaro_winkler(&name.to_ascii_lowercase(), &a.to_ascii_lowercase());
    let best = available.iter().map(|a| (score(a), a)).filter(|(s, _)| *s >= 0.8).max_by(|a, b| a.0.total_cmp(&b.0));
    best.map(|(_, a)| format!(" (did you mean `{a}`?)")).unwrap_or_default()
}

/// The message of [`DataError::TooFewTokens`].
struct TooFew<'a> {
    dataset: &'a str,
    split: crate::data::windows::WindowSplit,
    files: &'a [(PathBuf, usize)],
    block: usize,
}

impl fmt::Display for TooFew<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::data::windows::WindowSplit;
        let (source, block) = (self.dataset, self.block);
        for (i, (path, tokens)) in self.files.iter().enumerate() {
            let (separator, unit) = if i == 0 { ("", " tokens") } else { (", ", "") };
            write!(f, "{separator}{} {}{tokens}{unit}", path.display(), if i == 0 { "holds " } else { "" })?;
        }
        let (split, key, consequence) = match self.split {
            WindowSplit::Train => ("training", "train", "there is nothing to train on"),
            WindowSplit::Validation => ("validation", "validation", "nothing would be evaluated"),
        };
        let what = if source == "tokens" { "tokens" } else { "text" };
        // A JSONL file's block size is in its `text` group.
        let block_key =
            if source == "jsonl" { "jsonl.text.block_size".to_string() } else { format!("{source}.block_size") };
        write!(
            f,
            ": the {split} files need one window of data.{block_key} + 1 = {} tokens at least, so \
             {consequence}; give data.{source}.{key} more {what}",
            block + 1
        )?;
        // A block of 1 needs 2 tokens: the longest file tells what block would fit.
        let longest = self.files.iter().map(|&(_, t)| t).max().unwrap_or(0);
        if longest >= 2 {
            write!(f, ", lower data.{block_key} to {} or less", longest - 1)?;
        }
        match self.split {
            WindowSplit::Train => Ok(()),
            WindowSplit::Validation => write!(f, ", or drop data.{source}.validation"),
        }
    }
}

/// One file that no mirror could deliver, and why each attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileFailure {
    pub file: String,
    /// `(url, problem)` for every mirror tried, in order.
    pub attempts: Vec<(String, String)>,
}

struct DownloadReport<'a> {
    dataset: &'a str,
    dir: &'a PathBuf,
    failures: &'a [FileFailure],
}

impl fmt::Display for DownloadReport<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let files: Vec<&str> = self.failures.iter().map(|x| x.file.as_str()).collect();
        write!(f, "{}: could not download {} into {}:", self.dataset, files.join(", "), self.dir.display())?;
        for failure in self.failures {
            for (url, problem) in &failure.attempts {
                write!(f, "\n  {url}: {problem}")?;
            }
        }
        write!(
            f,
            "\nput the files in {} yourself, or set `data.dir` (or TRAINRUN_DATA_DIR) to a \
             folder that has them",
            self.dir.display()
        )
    }
}

fn idx_type_name(code: u8) -> &'static str {
    match code {
        0x08 => "unsigned byte",
        0x09 => "signed byte",
        0x0B => "short",
        0x0C => "int",
        0x0D => "float",
        0x0E => "double",
        _ => "unknown",
    }
}
