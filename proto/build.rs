//! Compiles the `.proto` files with protox (pure Rust), so a fresh machine needs no
//! protoc binary, and hands the descriptors to prost-build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/client.proto",
        "proto/rpc.proto",
        "proto/echo.proto",
        "proto/chat.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    prost_build::Config::new()
        .bytes(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
