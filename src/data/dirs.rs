//! Which folder holds a dataset: `data.dir`, `TRAINRUN_DATA_DIR`, or the user's cache folder.

use std::path::{Path, PathBuf};

/// The environment that decides the data folder, read once at the edge.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataDirs {
    /// `TRAINRUN_DATA_DIR`: the dataset folder itself.
    pub trainrun_data_dir: Option<PathBuf>,
    /// `XDG_CACHE_HOME`.
    pub xdg_cache_home: Option<PathBuf>,
    /// `HOME`.
    pub home: Option<PathBuf>,
    /// `TRAINRUN_TOKEN_CACHE`: the token cache's folder, for every dataset (else each data
    /// folder's `.trainrun-tokens`).
    pub token_cache: Option<PathBuf>,
    /// `TRAINRUN_DATA_CACHE`: where gzip IDX files (MNIST's) are kept inflated, so runs after
    /// the first skip inflating them; a sweep's driver points its trials at a folder of the
    /// sweep. Unset: every run inflates them.
    pub data_cache: Option<PathBuf>,
}

impl DataDirs {
    /// Reads the variables from the process environment (empty counts as unset).
    pub fn from_process_env() -> Self {
        let var = |key| std::env::var_os(key).filter(|v| !v.is_empty()).map(PathBuf::from);
        Self {
            trainrun_data_dir: var("TRAINRUN_DATA_DIR"),
            xdg_cache_home: var("XDG_CACHE_HOME"),
            home: var("HOME"),
            token_cache: var("TRAINRUN_TOKEN_CACHE"),
            data_cache: var("TRAINRUN_DATA_CACHE"),
        }
    }

    /// The token cache's folder for the data in `data_dir`: `TRAINRUN_TOKEN_CACHE`, else
    /// `<data_dir>/.trainrun-tokens`.
    pub fn token_cache(&self, data_dir: &Path) -> PathBuf {
        self.token_cache.clone().unwrap_or_else(|| data_dir.join(crate::data::source::text::cache::FOLDER))
    }

    /// The folder for `dataset`: `data.dir`, else `TRAINRUN_DATA_DIR`, else
    /// `$XDG_CACHE_HOME/trainrun/<dataset>`, else `$HOME/.cache/trainrun/<dataset>`.
    pub fn resolve(&self, spec_dir: Option<&Path>, dataset: &str) -> Option<PathBuf> {
        let cache = self
            .xdg_cache_home
            .clone()
            // The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
            .filter(|p| p.is_absolute())
            .or_else(|| self.home.as_ref().map(|h| h.join(".cache")));
        spec_dir
            .map(Path::to_path_buf)
            .or_else(|| self.trainrun_data_dir.clone())
            .or_else(|| cache.map(|c| c.join("trainrun").join(dataset)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs(data: Option<&str>, xdg: Option<&str>, home: Option<&str>) -> DataDirs {
        DataDirs {
            trainrun_data_dir: data.map(PathBuf::from),
            xdg_cache_home: xdg.map(PathBuf::from),
            home: home.map(PathBuf::from),
            token_cache: None,
            data_cache: None,
        }
    }

    #[test]
    fn data_dir_resolution_order() {
        let all = dirs(Some("/env"), Some("/xdg"), Some("/home/u"));
        let spec = Some(Path::new("/spec"));
        assert_eq!(all.resolve(spec, "mnist"), Some("/spec".into()));
        assert_eq!(all.resolve(None, "mnist"), Some("/env".into()));
        let no_env = dirs(None, Some("/xdg"), Some("/home/u"));
        assert_eq!(no_env.resolve(None, "mnist"), Some("/xdg/trainrun/mnist".into()));
        // A relative XDG_CACHE_HOME is invalid and skipped.
        let relative = dirs(None, Some("cache"), Some("/home/u"));
        let home = Some(PathBuf::from("/home/u/.cache/trainrun/fashion_mnist"));
        assert_eq!(relative.resolve(None, "fashion_mnist"), home);
        assert_eq!(dirs(None, None, None).resolve(None, "mnist"), None);
    }
}
