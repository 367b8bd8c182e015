//! Test certificates for TLS tests: a CA in a temp dir and the
//! certificates it signs, written as PEM files (rcgen).

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A CA in a temp dir, and the certificates it signed there.
pub struct Pki {
    dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
}

/// One side's files: certificate, key and the CA list it trusts.
#[derive(Clone, Debug)]
pub struct Identity {
    /// The certificate (PEM file).
    pub cert: String,
    /// Its private key (PEM file).
    pub key: String,
    /// The CA certificates it trusts (PEM file).
    pub ca: String,
}

impl Pki {
    /// A new CA whose common name is `name` followed by ` CA`.
    pub fn new(name: &str) -> Pki {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, format!("{name} CA"));
        let ca = CertifiedIssuer::self_signed(p, KeyPair::generate().expect("CA key")).expect("CA certificate");
        let dir = tempfile::Builder::new().prefix("xlfs-pki-").tempdir().expect("pki dir");
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).expect("write CA");
        Pki { dir, ca }
    }

    /// The CA certificate's file.
    pub fn ca(&self) -> String {
        self.dir.path().join("ca.pem").display().to_string()
    }

    /// A certificate for common name `cn`, valid for the names `sans`
    /// (DNS names or IP addresses), trusting this CA.
    pub fn issue(&self, cn: &str, sans: &[&str]) -> Identity {
        let mut p = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("params");
        p.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate().expect("key");
        let cert = p.signed_by(&key, &self.ca).expect("sign");
        let path = |ext: &str| self.dir.path().join(format!("{cn}.{ext}")).display().to_string();
        std::fs::write(path("pem"), cert.pem()).expect("write certificate");
        std::fs::write(path("key"), key.serialize_pem()).expect("write key");
        Identity { cert: path("pem"), key: path("key"), ca: self.ca() }
    }
}

impl Identity {
    /// The same identity trusting another CA list.
    pub fn trusting(&self, ca: &str) -> Identity {
        Identity { ca: ca.to_string(), ..self.clone() }
    }

    /// The transport options that turn TLS on with these files
    /// (protocol/client and protocol/server).
    pub fn options(&self) -> Vec<(&str, &str)> {
        vec![
            ("transport.socket.ssl-enabled", "on"),
            ("transport.socket.ssl-own-cert", self.cert.as_str()),
            ("transport.socket.ssl-private-key", self.key.as_str()),
            ("transport.socket.ssl-ca-list", self.ca.as_str()),
        ]
    }
}
