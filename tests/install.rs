//! Installation as a package: packaging/install.sh puts the shared library (with its soname and
//! links), the static library, both headers, a pkg-config file and a CMake package under a
//! prefix, and C and C++ programs build and run against that installed copy alone.
//!
//! Method: the script installs the libraries this test's own build made (`--artifacts`, so that
//! the test does not build a release copy) into a fresh prefix under the target folder; the
//! programs of ffi-tests/ are then compiled with nothing but what `pkg-config` (pointed at the
//! prefix) says, linked once against the shared and once against the static library, and run
//! with the prefix as the only library path.

use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The soname build.rs gives the shared library.
fn soname() -> String {
    let (major, minor) = (env!("CARGO_PKG_VERSION_MAJOR"), env!("CARGO_PKG_VERSION_MINOR"));
    if major == "0" { format!("libkvcore.so.0.{minor}") } else { format!("libkvcore.so.{major}") }
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{what} failed ({}):\n{text}", out.status);
    text
}

/// `pkg-config` over the prefix's .pc files only.
fn pkg_config(prefix: &Path, args: &[&str]) -> Vec<String> {
    let out = run(
        Command::new("pkg-config").args(args).arg("kvcore").env("PKG_CONFIG_LIBDIR", prefix.join("lib/pkgconfig")),
        &format!("pkg-config {args:?}"),
    );
    out.split_whitespace().map(str::to_owned).collect()
}

/// The `NEEDED` and `SONAME` entries of an ELF file.
fn dynamic(path: &Path) -> String {
    run(Command::new("readelf").arg("-d").arg(path), "readelf")
}

#[test]
fn installed_package_builds_c_and_cpp_programs() {
    let deps = std::env::current_exe().expect("test path").parent().expect("deps dir").to_path_buf();
    let target = deps.parent().and_then(Path::parent).expect("target dir").to_path_buf();
    let work = target.join("install-test");
    let _ = std::fs::remove_dir_all(&work);
    let prefix = work.join("prefix");
    run(
        Command::new("bash")
            .arg(Path::new(ROOT).join("packaging/install.sh"))
            .arg("--prefix")
            .arg(&prefix)
            .arg("--artifacts")
            .arg(&deps),
        "packaging/install.sh",
    );

    // The files and links a C user expects.
    let version = env!("CARGO_PKG_VERSION");
    let lib = prefix.join("lib");
    let real = lib.join(format!("libkvcore.so.{version}"));
    assert!(real.is_file() && !real.is_symlink(), "{} is the library itself", real.display());
    assert_eq!(std::fs::read_link(lib.join(soname())).expect("soname link"), PathBuf::from(real.file_name().unwrap()));
    assert_eq!(std::fs::read_link(lib.join("libkvcore.so")).expect("dev link"), PathBuf::from(soname()));
    assert!(dynamic(&real).contains(&format!("Library soname: [{}]", soname())), "{}", dynamic(&real));
    for f in ["lib/libkvcore.a", "include/kvcore.h", "include/kvcore.hpp", "lib/cmake/kvcore/kvcoreConfig.cmake"] {
        assert!(prefix.join(f).is_file(), "{f} installed");
    }
    assert_eq!(pkg_config(&prefix, &["--modversion"]), [version]);

    let cflags = pkg_config(&prefix, &["--cflags"]);
    assert_eq!(cflags, [format!("-I{}", prefix.join("include").display())], "only the installed headers");
    let shared = pkg_config(&prefix, &["--libs"]);
    let libdir = pkg_config(&prefix, &["--variable=libdir"]).concat();
    let static_libs: Vec<String> =
        pkg_config(&prefix, &["--static", "--libs-only-l"]).into_iter().filter(|l| l != "-lkvcore").collect();
    let out = work.join("bin");
    std::fs::create_dir_all(&out).expect("bin dir");

    let programs =
        [("c/serving_loop.c", true), ("c/capabilities.c", false), ("c/tiers.c", false), ("cpp/wrapper.cc", true)];
    for (source, also_static) in programs {
        let cpp = source.ends_with(".cc");
        for linkage in ["shared", "static"] {
            if linkage == "static" && !also_static {
                continue;
            }
            let stem = Path::new(source).file_stem().unwrap().to_string_lossy().into_owned();
            let exe = out.join(format!("{stem}-{linkage}"));
            let mut cmd = Command::new(if cpp { "c++" } else { "cc" });
            cmd.arg(if cpp { "-std=c++17" } else { "-std=c11" })
                .args(["-Werror", "-Wall", "-Wextra", "-Wpedantic", "-pthread"])
                .args(&cflags)
                // check.h, the test programs' own helper; kvcore.h comes from the prefix alone.
                .arg(format!("-I{ROOT}/ffi-tests/c"))
                .arg(Path::new(ROOT).join("ffi-tests").join(source))
                .arg("-o")
                .arg(&exe);
            if linkage == "shared" {
                cmd.args(&shared);
            } else {
                cmd.arg(Path::new(&libdir).join("libkvcore.a")).args(&static_libs);
            }
            run(&mut cmd, &format!("compiling {source} against the installed {linkage} library"));
            let needed = dynamic(&exe);
            assert_eq!(
                needed.contains(&format!("Shared library: [{}]", soname())),
                linkage == "shared",
                "{} needs the soname exactly when linked shared:\n{needed}",
                exe.display()
            );
            assert!(!needed.contains("RPATH") && !needed.contains("RUNPATH"), "no path into the build tree");
            let said = run(
                Command::new(&exe).env("LD_LIBRARY_PATH", &lib).current_dir(&work),
                &format!("running {}", exe.display()),
            );
            assert!(said.contains("all checks passed"), "{} said:\n{said}", exe.display());
        }
    }
}
