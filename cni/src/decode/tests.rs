use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::json;

use super::*;

#[derive(Debug, Deserialize, PartialEq, Default)]
#[serde(rename_all = "camelCase", default)]
struct Mapping {
    host_port: u16,
    container_port: u16,
    protocol: String,
    #[serde(rename = "hostIP")]
    host_ip: Option<String>,
}

#[derive(Debug, Deserialize, PartialEq, Default)]
#[serde(rename_all = "camelCase", default)]
struct Runtime {
    port_mappings: Vec<Mapping>,
}

#[derive(Debug, Deserialize, PartialEq, Default)]
#[serde(rename_all = "camelCase", default)]
struct Conf {
    name: String,
    backend: Option<String>,
    snat: Option<bool>,
    runtime_config: Runtime,
    capabilities: BTreeMap<String, bool>,
}

fn text<T: DeserializeOwned>(s: &str) -> Result<T, DecodeError> {
    from_slice(s.as_bytes())
}

#[test]
fn containerd_capitalised_keys_decode_into_camel_case_fields() {
    let conf: Conf = from_value(json!({
        "Name": "cbr0",
        "RuntimeConfig": {"portMappings": [
            {"HostPort": 30080, "ContainerPort": 8080, "Protocol": "tcp", "HostIP": ""},
            {"hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "192.0.2.10"}
        ]}
    }))
    .unwrap();
    assert_eq!(conf.name, "cbr0");
    assert_eq!(
        conf.runtime_config.port_mappings,
        vec![
            Mapping {
                host_port: 30080,
                container_port: 8080,
                protocol: "tcp".into(),
                host_ip: None
            },
            Mapping {
                host_port: 5353,
                container_port: 53,
                protocol: "udp".into(),
                host_ip: Some("192.0.2.10".into())
            },
        ]
    );
}

#[test]
fn later_duplicate_key_wins_whatever_its_case() {
    let a: Conf = text(r#"{"name": "first", "NAME": "second"}"#).unwrap();
    assert_eq!(a.name, "second");
    let b: Conf = text(r#"{"NAME": "first", "name": "second"}"#).unwrap();
    assert_eq!(b.name, "second");
    let c: Conf = text(r#"{"name": "first", "name": "second", "Name": "third"}"#).unwrap();
    assert_eq!(c.name, "third");
    // A later null leaves the earlier value, as Go leaves a non-pointer field alone.
    let d: Conf = text(r#"{"name": "first", "name": null}"#).unwrap();
    assert_eq!(d.name, "first");
}

#[test]
fn go_folds_the_kelvin_sign_and_the_long_s_too() {
    let conf: Conf = text("{\"\u{17f}nat\": true, \"NAM\u{212a}\": 1}").unwrap();
    assert_eq!(conf.snat, Some(true));
    assert!(go_fold_eq("mark", "MAR\u{212a}"));
    assert!(!go_fold_eq("mark", "mar\u{212a}x"));
    assert!(!go_fold_eq("name", "nam\u{e9}"));
    assert_eq!(match_field("mtu", &["MTU", "mtu"]), Some(1));
    assert_eq!(match_field("Mtu", &["MTU", "mtu"]), Some(0));
    assert_eq!(match_field("mtux", &["MTU", "mtu"]), None);
}

#[test]
fn exact_match_is_preferred_over_a_case_folded_one() {
    #[derive(Debug, Deserialize, Default)]
    #[serde(default)]
    struct Two {
        #[serde(rename = "mtu")]
        lower: u32,
        #[serde(rename = "MTU")]
        upper: u32,
    }
    let t: Two = text(r#"{"MTU": 1, "mtu": 2}"#).unwrap();
    assert_eq!((t.lower, t.upper), (2, 1));
    let t: Two = text(r#"{"Mtu": 3}"#).unwrap();
    assert_eq!(
        (t.lower, t.upper),
        (3, 0),
        "the first folded field in order"
    );
}

#[test]
fn empty_string_and_null_mean_unset_for_optional_fields() {
    let conf: Conf = text(r#"{"name": "n", "backend": "", "snat": null}"#).unwrap();
    assert_eq!(conf.backend, None);
    assert_eq!(conf.snat, None);
}

#[test]
fn null_leaves_a_required_field_at_its_default() {
    #[derive(Debug, Deserialize)]
    struct Strict {
        #[serde(default = "seven")]
        n: u32,
    }
    fn seven() -> u32 {
        7
    }
    let s: Strict = text(r#"{"n": null}"#).unwrap();
    assert_eq!(s.n, 7);
}

#[test]
fn unknown_keys_are_ignored_at_every_level() {
    let conf: Conf = text(
        r#"{"name": "n", "dns": {"Servers": ["10.96.0.10"]}, "x": [[{"y": [1, "]}"]}]],
            "runtimeConfig": {"cgroupPath": "/x", "portMappings": [{"hostPort": 1, "extra": true}]}}"#,
    )
    .unwrap();
    assert_eq!(conf.name, "n");
    assert_eq!(conf.runtime_config.port_mappings[0].host_port, 1);
}

#[test]
fn maps_keep_their_keys_verbatim_and_later_duplicates_win() {
    let conf: Conf =
        text(r#"{"capabilities": {"portMappings": true, "Bandwidth": false, "Bandwidth": true}}"#)
            .unwrap();
    assert_eq!(conf.capabilities.get("portMappings"), Some(&true));
    assert_eq!(conf.capabilities.get("Bandwidth"), Some(&true));
    assert_eq!(conf.capabilities.len(), 2);
}

#[test]
fn type_errors_name_the_path_of_the_value() {
    let cases = [
        (
            json!({"runtimeConfig": {"portMappings": [{}, {"hostPort": "80"}]}}),
            "runtimeConfig.portMappings[1].hostPort",
        ),
        (
            json!({"RuntimeConfig": {"PortMappings": [{"HostPort": 8080.0}]}}),
            "runtimeConfig.portMappings[0].hostPort",
        ),
        (
            json!({"runtimeConfig": {"portMappings": [{"hostPort": -1}]}}),
            "runtimeConfig.portMappings[0].hostPort",
        ),
        (
            json!({"runtimeConfig": {"portMappings": [{"hostPort": 70000}]}}),
            "runtimeConfig.portMappings[0].hostPort",
        ),
        (json!({"name": 5}), "name"),
        (json!({"runtimeConfig": []}), "runtimeConfig"),
        (json!({"capabilities": {"a": 1}}), "capabilities.a"),
    ];
    for (input, path) in cases {
        let err = from_value::<Conf>(input.clone()).unwrap_err();
        assert_eq!(err.path(), path, "{input}: {err}");
        assert!(err.to_string().starts_with(path), "{err}");
    }
    let err = text::<Vec<Conf>>(r#"[{}, {"name": true}]"#).unwrap_err();
    assert_eq!(err.path(), "[1].name");
}

#[test]
fn numbers_are_as_strict_as_go_s() {
    #[derive(Debug, Deserialize)]
    struct N {
        #[serde(default)]
        u: Option<u16>,
        #[serde(default)]
        i: Option<i32>,
        #[serde(default)]
        f: Option<f64>,
    }
    for bad in [
        r#"{"u": 1.0}"#,
        r#"{"u": 1e3}"#,
        r#"{"u": "1"}"#,
        r#"{"u": -1}"#,
        r#"{"u": -0}"#,
        r#"{"u": 65536}"#,
        r#"{"u": 18446744073709551616}"#,
        r#"{"i": 2147483648}"#,
        r#"{"i": 1.5}"#,
        r#"{"f": 1e400}"#,
        r#"{"f": true}"#,
    ] {
        let err = text::<N>(bad).unwrap_err();
        assert!(!err.path().is_empty(), "{bad}: {err}");
    }
    let n: N = text(r#"{"u": 65535, "i": -0, "f": 3}"#).unwrap();
    assert_eq!((n.u, n.i, n.f), (Some(65535), Some(0), Some(3.0)));
    let n: N = text(r#"{"i": -2147483648, "f": -1.5e-3}"#).unwrap();
    assert_eq!((n.i, n.f), (Some(i32::MIN), Some(-0.0015)));
}

#[test]
fn a_document_that_is_not_an_object_or_not_json_is_an_error() {
    let err = text::<Conf>("[1,2]").unwrap_err();
    assert_eq!(err.to_string(), "invalid type: array, expected Conf");
    let err = text::<Conf>(r#"{"name": "#).unwrap_err();
    assert_eq!(err.to_string(), "unexpected end of JSON input");
    // The whole text is checked before anything is decoded: the syntax error wins.
    let err = text::<Conf>(r#"{"name": 5, "x": [}"#).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid character '}' looking for beginning of value"
    );
}

#[test]
fn enums_raw_values_and_untyped_values_decode() {
    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "lowercase")]
    enum Backend {
        Iptables,
        Nftables,
        Custom(String),
    }
    #[derive(Debug, Deserialize)]
    struct WithEnum {
        backend: Option<Backend>,
        extra: Option<Value>,
        raw: Option<RawJson>,
    }
    let w: WithEnum = text(
        r#"{"Backend": "nftables", "extra": {"a": [1, -2, 2.5, null, "\u00e9"]},
            "raw": {"kept": [1, "as is"] }}"#,
    )
    .unwrap();
    assert_eq!(w.backend, Some(Backend::Nftables));
    assert_eq!(w.extra, Some(json!({"a": [1, -2, 2.5, null, "é"]})));
    let raw = w.raw.unwrap();
    assert_eq!(raw.as_bytes(), br#"{"kept": [1, "as is"] }"#);
    assert!(raw.is_object());
    assert_eq!(raw.to_value().unwrap(), json!({"kept": [1, "as is"]}));
    let w: WithEnum = text(r#"{"backend": {"custom": "x"}}"#).unwrap();
    assert_eq!(w.backend, Some(Backend::Custom("x".into())));
    let err = text::<WithEnum>(r#"{"backend": "ebtables"}"#).unwrap_err();
    assert_eq!(err.path(), "backend");
    assert!(err.message().contains("unknown variant"));
    let _ = Backend::Iptables;
}

#[test]
fn raw_json_checks_its_text_and_decodes_on_demand() {
    let raw = RawJson::parse(b" [1, {\"a\": [[]]}] ".to_vec()).unwrap();
    assert!(!raw.is_object());
    assert_eq!(raw.decode::<Value>().unwrap(), json!([1, {"a": [[]]}]));
    let err = RawJson::parse(b"[1,".to_vec()).unwrap_err();
    assert_eq!(err.to_string(), "unexpected end of JSON input");
    assert_eq!(RawJson::default().as_bytes(), b"null");
    assert_eq!(
        RawJson::from_value(&json!({"a": 1})).as_bytes(),
        br#"{"a":1}"#
    );
}

#[test]
fn an_object_of_forty_thousand_keys_keeps_go_s_rules() {
    // Unknown keys, case variants of known ones, and exact duplicates, interleaved: the last
    // key naming each field wins, nulls aside, and every other key is skipped.
    let mut doc = String::from("{");
    for i in 0..40_000 {
        let key = match i % 4 {
            0 => format!("unknown{i}"),
            1 => "NAME".to_owned(),
            2 => "name".to_owned(),
            _ => "Snat".to_owned(),
        };
        let value = match i % 4 {
            3 if i % 8 == 3 => "true".to_owned(),
            3 => "null".to_owned(),
            _ => format!("\"v{i}\""),
        };
        doc.push_str(&format!("\"{key}\": {value},"));
    }
    doc.push_str("\"capabilities\": {");
    for i in 0..40_000 {
        doc.push_str(&format!("\"c{}\": {},", i % 20_000, i >= 20_000));
    }
    doc.push_str("\"last\": true}}");
    let conf: Conf = text(&doc).unwrap();
    assert_eq!(conf.name, "v39998");
    assert_eq!(conf.snat, Some(true));
    assert_eq!(conf.capabilities.len(), 20_001);
    assert!(conf.capabilities.values().all(|&v| v));
}

/// `depth` nested arrays around `1`.
fn nested_arrays(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

#[test]
fn nesting_to_go_s_limit_decodes_and_deeper_is_go_s_syntax_error() {
    let deep = format!(r#"{{"name": "n", "x": {}}}"#, nested_arrays(MAX_DEPTH - 1));
    let conf: Conf = text(&deep).unwrap();
    assert_eq!(conf.name, "n");
    let too_deep = format!(r#"{{"name": "n", "x": {}}}"#, nested_arrays(MAX_DEPTH));
    let err = text::<Conf>(&too_deep).unwrap_err();
    assert_eq!(err.to_string(), "invalid character '[' exceeded max depth");
}

#[test]
fn untyped_values_are_refused_past_their_limit_naming_their_path() {
    #[derive(Debug, Deserialize)]
    struct Deep {
        x: Option<Value>,
        m: Option<BTreeMap<String, Value>>,
        skipped: Option<serde::de::IgnoredAny>,
    }
    let objects = |depth: usize| format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
    let ok: Deep = text(&format!(
        r#"{{"x": {}, "m": {{"k": {}}}, "skipped": {}}}"#,
        nested_arrays(MAX_UNTYPED_DEPTH),
        objects(MAX_UNTYPED_DEPTH),
        nested_arrays(MAX_DEPTH - 1)
    ))
    .unwrap();
    assert!(ok.m.is_some_and(|m| m.contains_key("k")) && ok.skipped.is_some());
    let mut depth = 0;
    let mut v = ok.x.as_ref().unwrap();
    while let Value::Array(items) = v {
        depth += 1;
        v = &items[0];
    }
    assert_eq!(depth, MAX_UNTYPED_DEPTH);
    for (doc, path) in [
        (
            format!(r#"{{"x": {}}}"#, nested_arrays(MAX_UNTYPED_DEPTH + 1)),
            "x",
        ),
        (
            format!(r#"{{"m": {{"k": {}}}}}"#, objects(MAX_DEPTH - 2)),
            "m.k",
        ),
    ] {
        let err = text::<Deep>(&doc).unwrap_err();
        assert_eq!(err.path(), path);
        assert!(
            err.message().starts_with("an untyped value nested"),
            "{err}"
        );
    }
}

#[test]
fn sorted_mode_takes_the_greatest_key_as_go_s_prev_result_path_does() {
    #[derive(Debug, Deserialize, Default)]
    #[serde(default)]
    struct V {
        #[serde(rename = "cniVersion")]
        version: String,
        dst: Option<String>,
    }
    let decode = |s: &str, inject: Option<&[u8]>| -> V {
        RawJson::parse(s.as_bytes().to_vec())
            .unwrap()
            .decode_with(Options {
                sorted_keys: true,
                inject_version: inject,
                ..Options::default()
            })
            .unwrap()
    };
    // "dst" sorts after "Dst", whatever the order in the document.
    assert_eq!(
        decode(r#"{"dst": "b", "Dst": "a"}"#, None).dst.unwrap(),
        "b"
    );
    assert_eq!(
        decode(r#"{"Dst": "a", "dst": "b"}"#, None).dst.unwrap(),
        "b"
    );
    // An exact duplicate ending in null erases its key; the other spelling then wins.
    assert_eq!(
        decode(r#"{"dst": "b", "Dst": "a", "dst": null}"#, None)
            .dst
            .unwrap(),
        "a"
    );
    // Injection: only without an exact CNIVersion key holding something other than "".
    let v = Some(&b"\"1.0.0\""[..]);
    assert_eq!(decode("{}", v).version, "1.0.0");
    assert_eq!(decode(r#"{"CNIVersion": ""}"#, v).version, "1.0.0");
    assert_eq!(decode(r#"{"CNIVersion": "0.4.0"}"#, v).version, "0.4.0");
    assert_eq!(decode(r#"{"cniVersion": "0.4.0"}"#, v).version, "0.4.0");
    assert_eq!(decode(r#"{"CNIVERSION": "0.4.0"}"#, v).version, "1.0.0");
    assert_eq!(decode(r#"{"x": {"CNIVersion": ""}}"#, v).version, "1.0.0");
}

#[test]
fn the_top_level_index_and_a_scan_of_the_same_object_agree() {
    #[derive(Debug, Deserialize, PartialEq)]
    struct Both {
        #[serde(default)]
        name: String,
        #[serde(default)]
        snat: Option<bool>,
        #[serde(default)]
        capabilities: BTreeMap<String, bool>,
    }
    let object = r#"{"x": [{"name": 1}], "NAME": "a", "snat": null, "Name": "b",
        "capabilities": {"a": true, "a": false}, "SNAT": true, "snat": null}"#;
    let top: Both = text(object).unwrap();
    let nested: Vec<Both> = text(&format!("[{object}]")).unwrap();
    assert_eq!(nested, [top]);
    assert_eq!(nested[0].name, "b");
    assert_eq!(nested[0].snat, Some(true));
    assert_eq!(nested[0].capabilities.get("a"), Some(&false));
}

/// A struct shaped as the reference's portmap config, with its Go type names.
#[derive(Debug, Deserialize, Default)]
#[serde(default, rename = "PortMapConf")]
#[allow(dead_code)]
struct GoConf {
    snat: Option<bool>,
    #[serde(rename = "markMasqBit")]
    mark_masq_bit: Option<i64>,
    #[serde(rename = "conditionsV4")]
    conditions: Option<Vec<String>>,
    labels: BTreeMap<String, u16>,
    #[serde(rename = "runtimeConfig")]
    runtime: GoRuntime,
}

#[derive(Debug, Deserialize, Default)]
#[serde(
    default,
    rename = "struct { PortMaps []main.PortMapEntry \"json:\\\"portMappings,omitempty\\\"\" }"
)]
#[allow(dead_code)]
struct GoRuntime {
    #[serde(rename = "portMappings")]
    port_mappings: Vec<GoMapping>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(default, rename = "main.PortMapEntry")]
#[allow(dead_code)]
struct GoMapping {
    #[serde(rename = "hostPort")]
    host_port: i64,
    ratio: f64,
}

#[test]
fn values_of_the_wrong_type_get_go_s_text() {
    let cases = [
        (
            r#"{"snat": "yes"}"#,
            "string into Go struct field PortMapConf.snat of type bool",
        ),
        (
            r#"{"snat": 1e999}"#,
            "number into Go struct field PortMapConf.snat of type bool",
        ),
        (
            r#"{"markMasqBit": 1.5}"#,
            "number 1.5 into Go struct field PortMapConf.markMasqBit of type int",
        ),
        (
            r#"{"markMasqBit": 1e3}"#,
            "number 1e3 into Go struct field PortMapConf.markMasqBit of type int",
        ),
        (
            r#"{"markMasqBit": 99999999999999999999}"#,
            "number 99999999999999999999 into Go struct field PortMapConf.markMasqBit of type int",
        ),
        (
            r#"{"markMasqBit": 1e999}"#,
            "number 1e999 into Go struct field PortMapConf.markMasqBit of type int",
        ),
        (
            r#"{"conditionsV4": "x"}"#,
            "string into Go struct field PortMapConf.conditionsV4 of type []string",
        ),
        (
            r#"{"conditionsV4": [true]}"#,
            "bool into Go struct field PortMapConf.conditionsV4 of type string",
        ),
        // Map keys are not part of Go's path.
        (
            r#"{"labels": {"a": -1}}"#,
            "number -1 into Go struct field PortMapConf.labels of type uint16",
        ),
        (
            r#"{"labels": {"a": 65536}}"#,
            "number 65536 into Go struct field PortMapConf.labels of type uint16",
        ),
        (
            r#"{"labels": [1]}"#,
            "array into Go struct field PortMapConf.labels of type map[string]uint16",
        ),
        // Nor are array indexes; the struct is the innermost one, without its package, and an
        // anonymous struct has no name.
        (
            r#"{"runtimeConfig": {"portMappings": [{}, {"hostPort": "80"}]}}"#,
            "string into Go struct field PortMapEntry.runtimeConfig.portMappings.hostPort of type int",
        ),
        (
            r#"{"runtimeConfig": {"portMappings": {}}}"#,
            "object into Go struct field .runtimeConfig.portMappings of type []main.PortMapEntry",
        ),
        (
            r#"{"runtimeConfig": {"portMappings": [[]]}}"#,
            "array into Go struct field .runtimeConfig.portMappings of type main.PortMapEntry",
        ),
        (
            r#"{"runtimeConfig": {"portMappings": [{"ratio": "x"}]}}"#,
            "string into Go struct field PortMapEntry.runtimeConfig.portMappings.ratio of type float64",
        ),
        (
            r#"{"runtimeConfig": {"portMappings": [{"ratio": 1e999}]}}"#,
            "number 1e999 into Go struct field PortMapEntry.runtimeConfig.portMappings.ratio of type float64",
        ),
        // Keys match case-insensitively; Go names the field as declared.
        (
            r#"{"SNAT": 0}"#,
            "number into Go struct field PortMapConf.snat of type bool",
        ),
        // Not a struct field at all.
        (r#"[1]"#, "array into Go value of type PortMapConf"),
    ];
    for (text, go) in cases {
        let err = text_of::<GoConf>(text);
        assert_eq!(
            err.go_text(),
            Some(format!("json: cannot unmarshal {go}").as_str()),
            "{text}: {err}"
        );
        assert_eq!(err.reference_text(), err.go_text().unwrap_or_default());
    }
}

fn text_of<T: DeserializeOwned + fmt::Debug>(s: &str) -> DecodeError {
    text::<T>(s).unwrap_err()
}

#[test]
fn null_is_the_zero_value_as_go_leaves_it() {
    let c: GoConf = text(
        r#"{"conditionsV4": [null, "a"], "labels": {"a": null},
            "runtimeConfig": {"portMappings": null}}"#,
    )
    .unwrap();
    assert_eq!(c.conditions, Some(vec![String::new(), "a".into()]));
    assert_eq!(c.labels.get("a"), Some(&0));
    assert!(c.runtime.port_mappings.is_empty());
    let v: Vec<Vec<bool>> = text("[null, [null, true]]").unwrap();
    assert_eq!(v, vec![vec![], vec![false, true]]);
}

#[test]
fn errors_know_where_their_value_starts_and_only_syntax_and_type_errors_have_go_s_text() {
    let text_ = r#"{"snat": true, "runtimeConfig": {"portMappings": [{"hostPort": "80"}]}}"#;
    let err = text_of::<GoConf>(text_);
    assert_eq!(err.offset(), text_.find("\"80\"").unwrap());
    let err = text_of::<GoConf>(r#"{"snat": tru}"#);
    assert_eq!(
        err.go_text(),
        Some("invalid character '}' in literal true (expecting 'e')")
    );
    // A visitor's own error: ours only.
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Addr {
        ip: std::net::IpAddr,
    }
    let err = text_of::<Addr>(r#"{"ip": "x"}"#);
    assert_eq!(err.go_text(), None);
    assert_eq!(err.reference_text(), err.to_string());
    assert_eq!(err.offset(), 7);
}

#[test]
fn a_document_can_stand_for_a_field_of_an_outer_struct() {
    let raw = RawJson::parse(br#"{"portMappings": [{"hostPort": true}]}"#.to_vec()).unwrap();
    let err = raw
        .decode_with::<GoRuntime>(Options {
            field_of: Some(("PortMapConf", "runtimeConfig")),
            ..Options::default()
        })
        .unwrap_err();
    assert_eq!(err.path(), "runtimeConfig.portMappings[0].hostPort");
    assert_eq!(
        err.go_text(),
        Some(
            "json: cannot unmarshal bool into Go struct field PortMapEntry.runtimeConfig.portMappings.hostPort of type int"
        )
    );
    let raw = RawJson::parse(b"5".to_vec()).unwrap();
    let err = raw
        .decode_with::<GoRuntime>(Options {
            field_of: Some(("PortMapConf", "runtimeConfig")),
            ..Options::default()
        })
        .unwrap_err();
    assert_eq!(
        err.go_text(),
        Some(
            r#"json: cannot unmarshal number into Go struct field PortMapConf.runtimeConfig of type struct { PortMaps []main.PortMapEntry "json:\"portMappings,omitempty\"" }"#
        )
    );
    // The top-level struct named as another (the envelope as the plugin's struct).
    let raw = RawJson::parse(br#"{"snat": 1}"#.to_vec()).unwrap();
    let err = raw
        .decode_with::<GoConf>(Options {
            top_struct: Some("TuningConf"),
            ..Options::default()
        })
        .unwrap_err();
    assert_eq!(
        err.go_text(),
        Some("json: cannot unmarshal number into Go struct field TuningConf.snat of type bool")
    );
}

/// Issue 26 item 4: the corners where Go decodes a key written more than once, or a `null`,
/// otherwise than "the later value wins".
#[derive(Debug, Deserialize, PartialEq, Default)]
#[serde(default, rename = "main.Corners")]
struct Corners {
    /// A Go `*bool`.
    #[serde(deserialize_with = "nullable")]
    snat: Option<bool>,
    /// A Go `bool`.
    #[serde(rename = "masqAll")]
    masq_all: Option<bool>,
    /// A Go `map[string]string`.
    #[serde(deserialize_with = "nullable")]
    sysctl: Option<BTreeMap<String, String>>,
    /// A Go `*[]string`.
    #[serde(deserialize_with = "nullable")]
    conditions: Option<Vec<String>>,
    /// A Go struct.
    #[serde(rename = "runtimeConfig")]
    runtime: Runtime,
    /// A Go `[]int`.
    ports: Vec<u16>,
    /// A Go `map[string]interface {}`.
    #[serde(rename = "prevResult", deserialize_with = "nullable")]
    prev: Option<RawObject>,
    /// A Go `interface {}`.
    any: Option<serde_json::Value>,
}

#[test]
fn a_later_null_resets_a_pointer_slice_or_map_and_leaves_a_value_alone() {
    let c: Corners =
        text(r#"{"snat": false, "SNAT": null, "masqAll": true, "MasqAll": null}"#).unwrap();
    assert_eq!(c.snat, None, "a *bool set nil: the default (true) applies");
    assert_eq!(c.masq_all, Some(true), "a bool left alone");
    let c: Corners = text(
        r#"{"sysctl": {"a": "1"}, "Sysctl": null, "conditions": ["x"], "Conditions": null,
            "ports": [1], "Ports": null}"#,
    )
    .unwrap();
    assert_eq!((c.sysctl, c.conditions), (None, None));
    assert!(c.ports.is_empty());
    // What comes after the null counts again.
    let c: Corners =
        text(r#"{"snat": null, "SNAT": false, "sysctl": null, "Sysctl": {"b": "2"}}"#).unwrap();
    assert_eq!(c.snat, Some(false));
    assert_eq!(c.sysctl.unwrap().len(), 1);
}

#[test]
fn a_repeated_object_merges_into_the_same_struct_or_map() {
    let c: Corners = text(
        r#"{"sysctl": {"arp_ignore": "1", "x": "a"}, "Sysctl": {"arp_announce": "2", "x": "b"},
            "runtimeConfig": {"portMappings": [{"hostPort": 80}]},
            "RuntimeConfig": {"portMappings": [{"containerPort": 81}, {"protocol": "udp"}]}}"#,
    )
    .unwrap();
    let sysctl = c.sysctl.unwrap();
    assert_eq!(sysctl.len(), 3, "{sysctl:?}");
    assert_eq!(sysctl["x"], "b");
    // The array's elements decode into the elements already there: the first merges.
    assert_eq!(
        c.runtime.port_mappings,
        [
            Mapping {
                host_port: 80,
                container_port: 81,
                ..Mapping::default()
            },
            Mapping {
                protocol: "udp".into(),
                ..Mapping::default()
            },
        ]
    );
    // Go 1.19's slice: a shorter array keeps the elements past its length in the backing
    // array, and a longer one after it decodes into them again.
    let m: Runtime = text(
        r#"{"portMappings": [{"hostPort": 1}, {"hostPort": 2}, {"hostPort": 3}],
            "PortMappings": [{"protocol": "a"}],
            "portMappingS": [{}, {"containerPort": 9}]}"#,
    )
    .unwrap();
    assert_eq!(
        m.port_mappings,
        [
            Mapping {
                host_port: 1,
                protocol: "a".into(),
                ..Mapping::default()
            },
            Mapping {
                host_port: 2,
                container_port: 9,
                ..Mapping::default()
            },
        ]
    );
    // Past the backing array's capacity (4, then 6) the elements are new.
    let m: Runtime = text(
        r#"{"portMappings": [{"hostPort": 1}, {"hostPort": 2}, {"hostPort": 3}, {"hostPort": 4}],
            "PortMappings": [{}],
            "portMappingS": [{}, {}, {}, {}, {}]}"#,
    )
    .unwrap();
    let hosts: Vec<u16> = m.port_mappings.iter().map(|p| p.host_port).collect();
    assert_eq!(hosts, [1, 2, 3, 4, 0]);
    // An empty array makes a new, empty slice.
    let m: Runtime =
        text(r#"{"portMappings": [{"hostPort": 1}], "PortMappings": [], "portMappingS": [{}]}"#)
            .unwrap();
    assert_eq!(m.port_mappings, [Mapping::default()]);
    // An untyped value and a raw object: the later replaces, the objects' entries add up.
    let c: Corners =
        text(r#"{"any": {"a": 1}, "ANY": [2], "prevResult": {"a": 1}, "PrevResult": {"b": 2}}"#)
            .unwrap();
    assert_eq!(c.any, Some(json!([2])));
    let prev: serde_json::Value = c.prev.unwrap().into_inner().to_value().unwrap();
    assert_eq!(prev, json!({"a": 1, "b": 2}));
}

#[test]
fn every_occurrence_of_a_scalar_must_fit_and_the_last_that_is_not_null_stays() {
    let err = text_of::<Conf>(r#"{"name": 5, "NAME": "n"}"#);
    assert_eq!(
        err.go_text(),
        Some("json: cannot unmarshal number into Go struct field Conf.name of type string")
    );
    let c: Conf = text(r#"{"name": "a", "Name": null}"#).unwrap();
    assert_eq!(c.name, "a");
    let err = text_of::<Corners>(r#"{"ports": [1], "Ports": [70000]}"#);
    assert_eq!(
        err.go_text(),
        Some(
            "json: cannot unmarshal number 70000 into Go struct field Corners.ports of type uint16"
        )
    );
}

#[test]
fn null_in_an_array_of_structs_is_a_zero_element_and_no_rust_type_name_is_ever_told() {
    let r: Runtime = text(r#"{"portMappings": [null, {"hostPort": 1}]}"#).unwrap();
    assert_eq!(r.port_mappings[0], Mapping::default());
    assert_eq!(r.port_mappings[1].host_port, 1);
    for (input, ours) in [
        (
            r#"{"portMappings": [5]}"#,
            "portMappings[0]: invalid type: number 5, expected Mapping",
        ),
        (
            r#"{"portMappings": {}}"#,
            "portMappings: invalid type: object, expected []Mapping",
        ),
        (
            r#"{"portMappings": [{"hostPort": 1.5}]}"#,
            "portMappings[0].hostPort: invalid type: number 1.5, expected uint16",
        ),
        (
            r#"{"portMappings": [{"hostPort": 70000}]}"#,
            "portMappings[0].hostPort: invalid value: number 70000, expected uint16",
        ),
        (
            r#"{"portMappings": [{"protocol": true}]}"#,
            "portMappings[0].protocol: invalid type: bool true, expected string",
        ),
    ] {
        let err = text_of::<Runtime>(input);
        assert_eq!(err.to_string(), ours, "{input}");
        for rust in [
            "struct ",
            "u16",
            "i64",
            "unit value",
            "sequence",
            "integer `",
        ] {
            assert!(!err.to_string().contains(rust), "{input}: {err}");
        }
    }
}

#[test]
fn a_number_no_float_holds_anywhere_in_an_untyped_value_is_go_s_error() {
    for input in [
        r#"{"prevResult": {"x": [1, {"y": 1e400}]}}"#,
        r#"{"prevResult": {"x": "1e400"}, "PrevResult": {"y": -1e999}}"#,
        r#"{"any": 1e400}"#,
        r#"{"any": {"a": [1e400]}, "ANY": 1}"#,
    ] {
        let err = text_of::<Corners>(input);
        let go = err.go_text().unwrap_or_default();
        assert!(
            go.starts_with("json: cannot unmarshal number ") && go.ends_with(" of type float64"),
            "{input}: {go}"
        );
    }
    // In a string, or a large integer a float holds: fine.
    let c: Corners =
        text(r#"{"prevResult": {"x": "1e400", "y": 123456789012345678901234567890}}"#).unwrap();
    assert!(c.prev.is_some());
}

/// Every value Go decodes fails as in Go, also one a later `null`, `[]` or `""` discards, or
/// one past a slice's final length.
#[test]
fn what_a_later_occurrence_discards_is_still_decoded() {
    for (input, field) in [
        // A pointer, slice or map reset by a null in the middle.
        (
            r#"{"conditions": [5], "Conditions": null, "conditions": ["a"]}"#,
            "conditions",
        ),
        (
            r#"{"sysctl": {"a": 1}, "Sysctl": null, "sysctl": {"b": "2"}}"#,
            "sysctl",
        ),
        (r#"{"ports": ["x"], "Ports": null, "ports": [1]}"#, "ports"),
        // Or at the end.
        (r#"{"ports": ["x"], "Ports": null}"#, "ports"),
        // An empty array makes a new empty slice.
        (r#"{"ports": [1, "x"], "Ports": []}"#, "ports"),
        // Elements past the final length.
        (r#"{"ports": [1, 2, "x"], "Ports": [3]}"#, "ports"),
        // An empty string means unset, after what came before.
        (r#"{"masqAll": 5, "MasqAll": ""}"#, "masqAll"),
    ] {
        let err = text_of::<Corners>(input);
        assert!(
            err.go_text()
                .is_some_and(|go| go.contains(&format!("Go struct field Corners.{field} "))),
            "{input}: {err} ({:?})",
            err.go_text()
        );
    }
    // Of several, the first in the document.
    let err = text_of::<Corners>(r#"{"ports": [1, "x"], "snat": 1, "Ports": [2]}"#);
    assert_eq!(err.path(), "ports[1]", "{err}");
    // Discarded values that fit leave the value the later occurrences gave.
    let c: Corners =
        text(r#"{"ports": [1, 2, 3], "Ports": [4], "sysctl": {"a": "1"}, "Sysctl": null}"#)
            .unwrap();
    assert_eq!((c.ports, c.sysctl), (vec![4], None));
}

#[derive(Debug, Deserialize, PartialEq, Default)]
#[serde(rename = "main.Entry")]
struct Entry {
    /// Required: a result's address.
    address: String,
    #[serde(default)]
    gateway: Option<String>,
}

/// A value whose Go type decodes itself (`UnmarshalJSON`), replaced by each occurrence.
#[derive(Debug, PartialEq)]
struct Whole(Entry);

impl<'de> Deserialize<'de> for Whole {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        each(d).map(Whole)
    }
}

#[derive(Debug, Deserialize, PartialEq, Default)]
#[serde(default, rename = "main.Wholes")]
struct Wholes {
    #[serde(deserialize_with = "nullable")]
    entry: Option<Whole>,
    #[serde(rename(deserialize = "present\0"), deserialize_with = "present")]
    present: Option<u32>,
}

#[test]
fn a_value_that_decodes_itself_is_replaced_by_each_occurrence() {
    let w: Wholes =
        text(r#"{"entry": {"address": "a", "gateway": "g"}, "Entry": {"address": "b"}}"#).unwrap();
    let entry = w.entry.unwrap().0;
    assert_eq!(
        (entry.address.as_str(), entry.gateway),
        ("b", None),
        "not merged"
    );
    // An earlier occurrence is decoded for its failures only: a field missing from it is none.
    let w: Wholes = text(r#"{"Entry": {"gateway": "g"}, "entry": {"address": "b"}}"#).unwrap();
    assert_eq!(w.entry.unwrap().0.address, "b");
    let err = text_of::<Wholes>(r#"{"Entry": {"gateway": 5}, "entry": {"address": "b"}}"#);
    assert!(err.go_text().is_some(), "{err}");
    let err = text_of::<Wholes>(r#"{"Entry": {"address": "b"}, "entry": {"gateway": "g"}}"#);
    assert_eq!(err.message(), "missing field `address`");
}

#[test]
fn a_field_marked_to_keep_its_nulls_is_present_even_when_null() {
    let w: Wholes = text(r#"{"present": null}"#).unwrap();
    assert_eq!(w.present, Some(0), "Go allocates the embedded struct");
    let w: Wholes = text(r#"{"PRESENT": 7, "present": null}"#).unwrap();
    assert_eq!(w.present, Some(7), "a null leaves a number alone");
    assert_eq!(text::<Wholes>("{}").unwrap().present, None);
    let err = text_of::<Wholes>(r#"{"present": "x"}"#);
    assert_eq!(
        err.path(),
        "present",
        "the mark is no part of the key: {err}"
    );
    assert!(
        err.go_text()
            .is_some_and(|go| go.ends_with("Go struct field Wholes.present of type uint32")),
        "{:?}",
        err.go_text()
    );
}
