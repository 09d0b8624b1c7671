//! The per-job token. Every request carries `authorization: Bearer <token>`; the server's
//! interceptor compares it in constant time and refuses anything else as `Unauthenticated`,
//! logging the peer and the RPC. The token keeps strangers on the network (and a second job on
//! the same hosts) from joining or steering a job; it is not encryption.

use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::{Service, http};
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::{Request, Status};

use super::ClusterError;

/// Shorter tokens are guessable; `new_job_token` makes 64 hex characters.
const MIN_TOKEN_LEN: usize = 16;

/// A job's secret. `Debug` hides it so it never lands in a log.
#[derive(Clone, PartialEq, Eq)]
pub struct JobToken(String);

impl JobToken {
    /// Checks a token given by a person: long enough, and printable ASCII so it fits a header.
    pub fn new(token: &str, origin: &str) -> Result<JobToken, ClusterError> {
        let bad = |problem| ClusterError::BadToken { origin: origin.to_owned(), problem };
        let token = token.trim();
        if token.is_empty() {
            return Err(bad("is empty"));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad("has characters other than printable ASCII"));
        }
        if token.len() < MIN_TOKEN_LEN {
            return Err(bad("is shorter than 16 characters, which is too easy to guess"));
        }
        Ok(JobToken(token.to_owned()))
    }

    /// The secret itself, for the launcher to hand to the tasks it starts.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn header(&self) -> String {
        format!("Bearer {}", self.0)
    }
}

impl std::fmt::Debug for JobToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobToken(…)")
    }
}

/// A fresh token for a job the local launcher starts: 32 bytes from the OS's CSPRNG, as hex.
pub fn new_job_token() -> Result<JobToken, ClusterError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| ClusterError::Random(e.to_string()))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(JobToken(hex))
}

/// The job's token: from `cluster.token_file` when the spec names one, else from the
/// `TRAINRUN_JOB_TOKEN` value the caller read. The file wins because it is the explicit choice
/// in the spec; the variable is how the local launcher passes its token to its tasks.
pub fn resolve_token(env_value: Option<&str>, file: Option<&Path>) -> Result<JobToken, ClusterError> {
    match (file, env_value) {
        (Some(path), _) => {
            use std::os::unix::fs::PermissionsExt;
            let unreadable = |source| ClusterError::TokenFile { path: path.to_owned(), source };
            let mode = std::fs::metadata(path).map_err(unreadable)?.permissions().mode() & 0o777;
            // As ssh refuses a private key others can read: whoever reads it joins the job.
            if mode & 0o077 != 0 {
                return Err(ClusterError::TokenFileOpen { path: path.to_owned(), mode });
            }
            let text = std::fs::read_to_string(path).map_err(unreadable)?;
            JobToken::new(&text, &path.display().to_string())
        }
        (None, Some(value)) => JobToken::new(value, "TRAINRUN_JOB_TOKEN"),
        (None, None) => Err(ClusterError::NoToken),
    }
}

/// Equal-length inputs take the same time whatever they hold, so response timing tells an
/// attacker nothing about how much of a guess was right. Length is not secret.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Client side: adds the token to every request.
#[derive(Clone)]
pub(crate) struct AddToken(AsciiMetadataValue);

impl AddToken {
    pub(crate) fn new(token: &JobToken) -> Result<AddToken, ClusterError> {
        // `JobToken::new` admits only printable ASCII, which is always a valid header value.
        MetadataValue::try_from(token.header())
            .map(AddToken)
            .map_err(|_| ClusterError::BadToken { origin: "the config".into(), problem: "is not a valid header value" })
    }
}

impl Interceptor for AddToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request.metadata_mut().insert("authorization", self.0.clone());
        Ok(request)
    }
}

/// The RPC a request is for; tonic's interceptors see headers but not the path.
#[derive(Clone)]
struct RpcPath(String);

/// Server side: refuses requests without the job's token.
#[derive(Clone)]
pub(crate) struct CheckToken {
    expected: Arc<[u8]>,
}

impl CheckToken {
    pub(crate) fn new(token: &JobToken) -> CheckToken {
        CheckToken { expected: token.header().into_bytes().into() }
    }
}

impl Interceptor for CheckToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let given = request.metadata().get("authorization");
        if given.is_some_and(|v| constant_time_eq(v.as_bytes(), &self.expected)) {
            return Ok(request);
        }
        let peer = request.remote_addr().map_or_else(|| "an unknown peer".to_owned(), |a| a.to_string());
        let rpc = request.extensions().get::<RpcPath>().map_or("an unknown RPC", |p| p.0.as_str());
        let what = if given.is_some() { "a wrong" } else { "no" };
        eprintln!("trainrun: control plane refused {rpc} from {peer}: {what} job token");
        Err(Status::unauthenticated("missing or wrong job token"))
    }
}

/// Records each request's path for [`CheckToken`]'s log line, then hands it on unchanged.
#[derive(Clone)]
pub(crate) struct TagRpc<S>(pub(crate) S);

impl<S, B> Service<http::Request<B>> for TagRpc<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let path = RpcPath(request.uri().path().to_owned());
        request.extensions_mut().insert(path);
        self.0.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_hex() {
        let (a, b) = (new_job_token().unwrap(), new_job_token().unwrap());
        assert_eq!(a.as_str().len(), 64);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert_eq!(format!("{a:?}"), "JobToken(…)");
    }

    #[test]
    fn the_token_file_wins_over_the_variable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.token");
        std::fs::write(&path, "from-the-file-0123456789\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = resolve_token(None, Some(&path)).unwrap_err();
        assert!(err.to_string().contains("permissions 0644") && err.to_string().contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let t = resolve_token(Some("from-the-env-0123456789"), Some(&path)).unwrap();
        assert_eq!(t.as_str(), "from-the-file-0123456789");
        let t = resolve_token(Some("from-the-env-0123456789"), None).unwrap();
        assert_eq!(t.as_str(), "from-the-env-0123456789");
    }

    #[test]
    fn missing_empty_short_and_unreadable_tokens_are_errors() {
        assert!(matches!(resolve_token(None, None), Err(ClusterError::NoToken)));
        let err = resolve_token(Some("  \n"), None).unwrap_err();
        assert_eq!(err.to_string(), "the job token from TRAINRUN_JOB_TOKEN is empty");
        let err = resolve_token(Some("short"), None).unwrap_err();
        assert!(err.to_string().contains("shorter than 16"), "{err}");
        let err = resolve_token(Some("has a space in it, sadly"), None).unwrap_err();
        assert!(err.to_string().contains("printable ASCII"), "{err}");
        let missing = Path::new("/nonexistent/trainrun/job.token");
        let err = resolve_token(None, Some(missing)).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/trainrun/job.token"), "{err}");
    }

    #[test]
    fn comparison_needs_every_byte() {
        assert!(constant_time_eq(b"Bearer abc", b"Bearer abc"));
        assert!(!constant_time_eq(b"Bearer abc", b"Bearer abd"));
        assert!(!constant_time_eq(b"Bearer abc", b"Bearer ab"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
