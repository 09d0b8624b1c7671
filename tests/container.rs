//! The Containerfile builds: a static musl trainrun `FROM scratch`, with buildah (Debian's
//! package), offline, and the image runs `trainrun --version` under `buildah run`. Skips
//! loudly when buildah or the musl target is missing (`.ci/run` installs both when it can).
//! The musl build has its own target folder under `target/`, so it costs a full build once.

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
    let build = Command::new(env!("CARGO"))
        .args(["build", "--release", "--locked", "--target", "x86_64-unknown-linux-musl", "--bin", "trainrun"])
        .current_dir(root)
        .output()
        .unwrap();
    assert!(build.status.success(), "{}", String::from_utf8_lossy(&build.stderr));
    let binary = root.join("target/x86_64-unknown-linux-musl/release/trainrun");
    let file = Command::new("file").arg(&binary).output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    if let Ok(f) = file {
        assert!(f.contains("statically linked") || f.contains("static-pie"), "not static: {f}");
    }
    let tag = format!("localhost/trainrun-test:{}", std::process::id());
    let storage = common::tempdir();
    let buildah = |args: &[&str]| {
        Command::new("buildah")
            .args(["--storage-driver", "vfs", "--root"])
            .arg(storage.path().join("root"))
            .arg("--runroot")
            .arg(storage.path().join("run"))
            .args(args)
            .current_dir(root)
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
