//! The Containerfile builds: a static musl trainrun `FROM scratch`, with buildah (Debian's
//! package), offline, and the image runs `trainrun --version` under `buildah run`. Skips
//! loudly when buildah or the musl target is missing (`.ci/run` installs both when it can).
//!
//! What this checks is the packaging (a static binary, an image with nothing else, its
//! entry point), not the optimizer, so the musl binary is built without optimization
//! (`opt-level` 0, no debug info: 3 min 15 s on the 2-core reference machine, where the
//! release profile is a whole optimized build of every dependency again, about 11 min, a third
//! of CI's budget). It goes into its own target folder (`target/container-test`), never into
//! `target/x86_64-unknown-linux-musl`, which holds a user's real image binary, and the image
//! is built from a context folder laid out as the Containerfile expects. A static binary cannot
//! load the CUDA libraries, so the image is the CPU-only build (`--no-default-features`), and
//! this test is also what compiles that build in CI. `.ci/run` starts this same build (same
//! command and variables, so the fingerprints match: keep the two in step) at idle priority,
//! where it runs on what the suite leaves of the cores; the `zz_` in this file's name makes
//! cargo, which runs test binaries in name order, run this one last, when that build is
//! mostly or wholly done (placed among the c's, it waited 3.5 minutes for it in CI-like runs).

mod common;

use std::path::Path;
use std::process::Command;

fn have(program: &str, args: &[&str]) -> bool {
    Command::new(program).args(args).output().is_ok_and(|o| o.status.success())
}

fn skip(why: &str) {
    println!("skipped: {why}");
    eprintln!("skipped: {why}");
}

#[test]
fn the_containerfile_builds_a_static_image_from_scratch() {
    if !have("buildah", &["--version"]) {
        return skip("buildah is not installed (apt-get install buildah)");
    }
    let targets = Command::new("rustup").args(["target", "list", "--installed"]).output();
    let musl = targets.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("x86_64-unknown-linux-musl"));
    if !musl || !have("musl-gcc", &["--version"]) {
        return skip(
            "the x86_64-unknown-linux-musl target or musl-gcc is missing (rustup target add …; apt-get install musl-tools)",
        );
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target_dir = root.join("target/container-test");
    let build = Command::new(env!("CARGO"))
        .args(["build", "--release", "--locked", "--no-default-features", "--target", "x86_64-unknown-linux-musl"])
        .args(["--bin", "trainrun"])
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "0")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .current_dir(root)
        .output()
        .unwrap();
    assert!(build.status.success(), "{}", String::from_utf8_lossy(&build.stderr));
    let built = target_dir.join("x86_64-unknown-linux-musl/release/trainrun");
    let file = Command::new("file").arg(&built).output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    if let Ok(f) = file {
        assert!(f.contains("statically linked") || f.contains("static-pie"), "not static: {f}");
    }
    // The build context: the Containerfile and the binary where its COPY line looks.
    let context = common::tempdir();
    let binary = context.path().join("target/x86_64-unknown-linux-musl/release/trainrun");
    std::fs::create_dir_all(binary.parent().unwrap()).unwrap();
    std::fs::copy(&built, &binary).unwrap();
    std::fs::copy(root.join("Containerfile"), context.path().join("Containerfile")).unwrap();
    let tag = format!("localhost/trainrun-test:{}", std::process::id());
    let storage = common::tempdir();
    let buildah = |args: &[&str]| {
        Command::new("buildah")
            .args(["--storage-driver", "vfs", "--root"])
            .arg(storage.path().join("root"))
            .arg("--runroot")
            .arg(storage.path().join("run"))
            .args(args)
            .current_dir(context.path())
            .output()
            .unwrap()
    };
    let bud = buildah(&["bud", "--isolation", "chroot", "-f", "Containerfile", "-t", &tag, "."]);
    assert!(bud.status.success(), "{}", String::from_utf8_lossy(&bud.stderr));
    let from = buildah(&["from", &tag]);
    assert!(from.status.success(), "{}", String::from_utf8_lossy(&from.stderr));
    let container = String::from_utf8_lossy(&from.stdout).trim().to_owned();
    let run = buildah(&["run", "--isolation", "chroot", &container, "--", "/trainrun", "--version"]);
    let _ = buildah(&["rm", &container]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(String::from_utf8_lossy(&run.stdout).starts_with("trainrun "), "{:?}", run);
}
