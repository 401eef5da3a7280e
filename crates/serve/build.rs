//! Compiles `proto/grpc_predict_v2.proto` (the KServe v2 gRPC API) with the vendored protoc,
//! so a build needs no system protoc.

fn main() {
    println!("cargo:rerun-if-changed=proto/grpc_predict_v2.proto");
    println!("cargo:rerun-if-changed=build.rs");
    let protoc = protoc_bin_vendored::protoc_bin_path()
        .expect("protoc-bin-vendored has no protoc for this platform");
    // SAFETY: build scripts are single-threaded here; protoc is looked up through PROTOC.
    unsafe { std::env::set_var("PROTOC", protoc) };
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // tonic-prost's codec with smaller first buffers (see `grpc::Codec`).
        .codec_path("crate::grpc::Codec")
        // Tensor bytes as `bytes::Bytes`: the raw contents reach the model without a copy.
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        .compile_protos(&["proto/grpc_predict_v2.proto"], &["proto"])
        .expect("compile proto/grpc_predict_v2.proto");
}
