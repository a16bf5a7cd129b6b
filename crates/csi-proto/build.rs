//! Compiles `proto/csi.proto` with protox (pure Rust, no system `protoc`) and generates:
//!
//! - the prost messages and tonic clients and servers (`csi.v1.rs`);
//! - a redacting `Debug` for every message that has a field marked `(csi_secret) = true`
//!   (`secret_debug.rs`), read from the option in the compiled descriptor, never from a list
//!   kept by hand;
//! - the `Rpc` table: every rpc with its service, path and flags (`rpcs.rs`);
//! - the encoded file descriptor set, for tests and reflection (`csi_descriptor.bin`);
//! - for tests only, a function that decodes any message by full name and prints its `Debug`
//!   (`debug_dispatch.rs`), so the redaction test covers every message without a hand-kept list.

use std::collections::BTreeSet;
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;

use prost_reflect::{DescriptorPool, MessageDescriptor};

const PROTO_DIR: &str = "proto";
const PROTO_FILE: &str = "csi.proto";
const PACKAGE: &str = "csi.v1";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO_DIR}/{PROTO_FILE}");
    println!("cargo:rerun-if-changed=build.rs");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    let mut compiler = protox::Compiler::new([PROTO_DIR])?;
    compiler.include_imports(true).include_source_info(true);
    compiler.open_file(PROTO_FILE)?;
    let pool = compiler.descriptor_pool();

    let secret_ext = pool
        .get_extension_by_name(&format!("{PACKAGE}.csi_secret"))
        .ok_or("csi.proto does not declare the csi_secret extension")?;
    let alpha_method = pool
        .get_extension_by_name(&format!("{PACKAGE}.alpha_method"))
        .ok_or("csi.proto does not declare the alpha_method extension")?;
    let alpha_service = pool
        .get_extension_by_name(&format!("{PACKAGE}.alpha_service"))
        .ok_or("csi.proto does not declare the alpha_service extension")?;

    // Messages that carry at least one secret field, by full protobuf name.
    let mut secret_messages: Vec<(MessageDescriptor, BTreeSet<String>)> = Vec::new();
    for message in pool.all_messages() {
        if message.package_name() != PACKAGE {
            continue;
        }
        let secret_fields: BTreeSet<String> = message
            .fields()
            .filter(|field| {
                field
                    .options()
                    .get_extension(&secret_ext)
                    .as_bool()
                    .unwrap_or(false)
            })
            .map(|field| field.name().to_owned())
            .collect();
        if !secret_fields.is_empty() {
            secret_messages.push((message, secret_fields));
        }
    }

    let skip: Vec<String> = secret_messages
        .iter()
        .map(|(m, _)| format!(".{}", m.full_name()))
        .collect();
    let grpc = env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure()
        .build_client(grpc)
        .build_server(grpc)
        .build_transport(false)
        // tonic's codec with smaller first buffers: see src/codec.rs.
        .codec_path("crate::codec::CsiCodec")
        .skip_debug(skip)
        .compile_fds(compiler.file_descriptor_set())?;

    fs::write(
        out_dir.join("secret_debug.rs"),
        secret_debug(&secret_messages),
    )?;
    fs::write(
        out_dir.join("rpcs.rs"),
        rpc_table(&pool, &alpha_method, &alpha_service),
    )?;
    fs::write(out_dir.join("debug_dispatch.rs"), debug_dispatch(&pool))?;
    fs::write(
        out_dir.join("csi_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    kubelet_registration(grpc)?;
    Ok(())
}

/// Kubelet's plugin registration protocol (`pluginregistration.proto`), the messages always,
/// the client and server with the `grpc` feature. It carries no secrets.
fn kubelet_registration(grpc: bool) -> Result<(), Box<dyn std::error::Error>> {
    const FILE: &str = "pluginregistration.proto";
    println!("cargo:rerun-if-changed={PROTO_DIR}/{FILE}");
    let mut compiler = protox::Compiler::new([PROTO_DIR])?;
    compiler.include_imports(true);
    compiler.open_file(FILE)?;
    tonic_prost_build::configure()
        .build_client(grpc)
        .build_server(grpc)
        .build_transport(false)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}

/// The Rust path of a message relative to the `v1` module, as prost lays it out.
fn rust_path(message: &MessageDescriptor) -> String {
    let mut parts = vec![upper_camel(message.name())];
    let mut parent = message.parent_message();
    while let Some(p) = parent {
        parts.push(snake(p.name()));
        parent = p.parent_message();
    }
    parts.reverse();
    parts.join("::")
}

/// prost's type name for a message: `RPC` becomes `Rpc`.
fn upper_camel(name: &str) -> String {
    snake(name)
        .split('_')
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect()
}

fn rust_ident(name: &str) -> String {
    match name {
        "type" | "match" | "ref" | "mod" | "fn" | "loop" | "move" | "use" => format!("r#{name}"),
        other => other.to_owned(),
    }
}

fn snake(camel: &str) -> String {
    let mut out = String::new();
    let chars: Vec<char> = camel.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() {
            let prev_lower = i > 0 && !chars[i - 1].is_ascii_uppercase();
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            let prev_upper = i > 0 && chars[i - 1].is_ascii_uppercase();
            if i > 0 && (prev_lower || (prev_upper && next_lower)) {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(*c);
        }
    }
    out
}

fn secret_debug(messages: &[(MessageDescriptor, BTreeSet<String>)]) -> String {
    let mut src =
        String::from("// Generated by build.rs from the csi_secret options. Do not edit.\n\n");
    src.push_str(
        "/// Every field marked `(csi_secret) = true` in `csi.proto`, as `(message, field)`.\n",
    );
    src.push_str("pub const SECRET_FIELDS: &[(&str, &str)] = &[\n");
    for (message, fields) in messages {
        for field in fields {
            let _ = writeln!(src, "    ({:?}, {:?}),", message.full_name(), field);
        }
    }
    src.push_str("];\n\n");
    for (message, secret_fields) in messages {
        let path = rust_path(message);
        let _ = writeln!(src, "impl ::core::fmt::Debug for v1::{path} {{");
        src.push_str(
            "    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {\n",
        );
        let _ = writeln!(src, "        f.debug_struct({:?})", message.name());
        let mut oneofs_done = BTreeSet::new();
        for field in message.fields() {
            if let Some(oneof) = field.containing_oneof() {
                if oneofs_done.insert(oneof.name().to_owned()) {
                    let ident = rust_ident(oneof.name());
                    let _ = writeln!(src, "            .field({:?}, &self.{ident})", oneof.name());
                }
                continue;
            }
            let ident = rust_ident(field.name());
            if secret_fields.contains(field.name()) {
                let _ = writeln!(
                    src,
                    "            .field({:?}, &crate::Redacted(&self.{ident}))",
                    field.name()
                );
            } else {
                let _ = writeln!(src, "            .field({:?}, &self.{ident})", field.name());
            }
        }
        src.push_str("            .finish()\n    }\n}\n\n");
    }
    src
}

fn debug_dispatch(pool: &DescriptorPool) -> String {
    let mut src = String::from(
        "// Generated by build.rs: decode any csi.v1 message by full name and print its Debug.\n\n\
         #[allow(dead_code)]\n\
         fn decode_debug(full_name: &str, bytes: &[u8]) -> Option<Result<String, ::prost::DecodeError>> {\n    \
         match full_name {\n",
    );
    for message in pool.all_messages() {
        if message.package_name() != PACKAGE || message.is_map_entry() {
            continue;
        }
        let _ = writeln!(
            src,
            "        {:?} => Some(<::csi_proto::v1::{} as ::prost::Message>::decode(bytes).map(|m| format!(\"{{m:?}}\"))),",
            message.full_name(),
            rust_path(&message)
        );
    }
    src.push_str("        _ => None,\n    }\n}\n");
    src
}

fn rpc_table(
    pool: &DescriptorPool,
    alpha_method: &prost_reflect::ExtensionDescriptor,
    alpha_service: &prost_reflect::ExtensionDescriptor,
) -> String {
    struct Row {
        service: String,
        name: String,
        streaming: bool,
        alpha: bool,
        request: String,
    }
    let mut rows = Vec::new();
    let mut services = Vec::new();
    for service in pool.services() {
        if service.package_name() != PACKAGE {
            continue;
        }
        let service_alpha = service
            .options()
            .get_extension(alpha_service)
            .as_bool()
            .unwrap_or(false);
        services.push(service.name().to_owned());
        for method in service.methods() {
            let alpha = service_alpha
                || method
                    .options()
                    .get_extension(alpha_method)
                    .as_bool()
                    .unwrap_or(false);
            rows.push(Row {
                service: service.name().to_owned(),
                name: method.name().to_owned(),
                streaming: method.is_server_streaming(),
                alpha,
                request: method.input().name().to_owned(),
            });
        }
    }

    let mut src =
        String::from("// Generated by build.rs from the services in csi.proto. Do not edit.\n\n");
    src.push_str("/// The CSI services.\n#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]\npub enum Service {\n");
    for s in &services {
        let _ = writeln!(src, "    /// The `csi.v1.{s}` service.\n    {s},");
    }
    src.push_str("}\n\nimpl Service {\n    /// Every service, in declaration order.\n    pub const ALL: &'static [Service] = &[");
    for s in &services {
        let _ = write!(src, "Service::{s}, ");
    }
    src.push_str("];\n\n    /// The short service name, e.g. `Node`.\n    pub const fn name(self) -> &'static str {\n        match self {\n");
    for s in &services {
        let _ = writeln!(src, "            Service::{s} => {s:?},");
    }
    src.push_str("        }\n    }\n}\n\n");

    src.push_str("/// Every rpc of every CSI service.\n#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]\npub enum Rpc {\n");
    for r in &rows {
        let _ = writeln!(
            src,
            "    /// `/{PACKAGE}.{}/{}`, request `{}`{}{}.",
            r.service,
            r.name,
            r.request,
            if r.streaming {
                ", server-streaming"
            } else {
                ""
            },
            if r.alpha { ", alpha" } else { "" }
        );
        let _ = writeln!(src, "    {},", r.name);
    }
    src.push_str("}\n\n/// Full gRPC paths of every rpc, e.g. [`paths::NODE_PUBLISH_VOLUME`].\npub mod paths {\n");
    for r in &rows {
        let _ = writeln!(
            src,
            "    /// Path of `{}.{}`.\n    pub const {}: &str = \"/{PACKAGE}.{}/{}\";",
            r.service,
            r.name,
            snake(&r.name).to_ascii_uppercase(),
            r.service,
            r.name
        );
    }
    src.push_str("}\n\nimpl Rpc {\n    /// Every rpc, in declaration order.\n    pub const ALL: &'static [Rpc] = &[\n");
    for r in &rows {
        let _ = writeln!(src, "        Rpc::{},", r.name);
    }
    src.push_str("    ];\n\n    /// The rpc's name, e.g. `NodePublishVolume`.\n    pub const fn name(self) -> &'static str {\n        match self {\n");
    for r in &rows {
        let _ = writeln!(src, "            Rpc::{0} => {0:?},", r.name);
    }
    src.push_str("        }\n    }\n\n    /// The service the rpc belongs to.\n    pub const fn service(self) -> Service {\n        match self {\n");
    for r in &rows {
        let _ = writeln!(
            src,
            "            Rpc::{} => Service::{},",
            r.name, r.service
        );
    }
    src.push_str("        }\n    }\n\n    /// The full gRPC path, e.g. `/csi.v1.Node/NodePublishVolume`.\n    pub const fn path(self) -> &'static str {\n        match self {\n");
    for r in &rows {
        let _ = writeln!(
            src,
            "            Rpc::{} => paths::{},",
            r.name,
            snake(&r.name).to_ascii_uppercase()
        );
    }
    src.push_str("        }\n    }\n\n    /// Whether the server answers with a stream of messages.\n    pub const fn is_server_streaming(self) -> bool {\n        matches!(self, ");
    let streaming: Vec<String> = rows
        .iter()
        .filter(|r| r.streaming)
        .map(|r| format!("Rpc::{}", r.name))
        .collect();
    src.push_str(&streaming.join(" | "));
    src.push_str(")\n    }\n\n    /// Whether the rpc (or its whole service) is marked alpha in the spec.\n    pub const fn is_alpha(self) -> bool {\n        matches!(self, ");
    let alpha: Vec<String> = rows
        .iter()
        .filter(|r| r.alpha)
        .map(|r| format!("Rpc::{}", r.name))
        .collect();
    src.push_str(&alpha.join(" | "));
    src.push_str(")\n    }\n\n    /// The rpc with this full gRPC path, if any.\n    pub fn from_path(path: &str) -> Option<Rpc> {\n        Rpc::ALL.iter().copied().find(|rpc| rpc.path() == path)\n    }\n}\n");
    src
}
