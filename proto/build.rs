//! Compiles the `.proto` files with protox (pure Rust), so a fresh machine needs no
//! protoc binary, and hands the descriptors to prost-build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/client.proto",
        "proto/rpc.proto",
        "proto/echo.proto",
        "proto/chat.proto",
        "proto/arena.proto",
        "proto/profile.proto",
        "proto/status.proto",
        "proto/resume.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    // Kept for workers to announce (see `ServiceSchema`): gates learn types at run time.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("descriptors.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    prost_build::Config::new()
        .bytes(["."])
        .enable_type_names()
        .compile_fds(descriptors)?;
    Ok(())
}
