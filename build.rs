//! Gives the shared library (`libkvcore.so`, the cdylib) its soname, as C and C++ users expect of
//! an installed library: `libkvcore.so.<major>` from 1.0 on, `libkvcore.so.0.<minor>` before (a
//! 0.x minor release may break the ABI), the rule cargo-c follows. packaging/install.sh installs
//! the file under that name with the usual links.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets the package version");
    let minor = std::env::var("CARGO_PKG_VERSION_MINOR").expect("cargo sets the package version");
    let soname = if major == "0" { format!("libkvcore.so.0.{minor}") } else { format!("libkvcore.so.{major}") };
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
}
