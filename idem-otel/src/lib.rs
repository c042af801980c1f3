//! OpenTelemetry export of idem's tool-call spans over OTLP (HTTP with
//! protobuf bodies); the facade's `idem::otel` (feature `otel`).
//!
//! Every tool call runs inside a `tracing` span (target `idem::call`, level
//! INFO) named after the tool, with the attributes `idem.tool`,
//! `idem.class`, `idem.key`, `idem.run`, `idem.worker`, `idem.outcome`,
//! `idem.replayed`, `idem.attempt` and `idem.journal_us`; each attempt of
//! the tool's body is a child span `idem.attempt` (and each `verify` a
//! child `idem.verify`), so a retry's attempts sit under their call. The
//! runtime makes these spans whether or not this crate is built; this
//! crate ships them to an OpenTelemetry collector.
//!
//! [`Exporter::install`] sets a global subscriber that exports them;
//! [`Exporter::build`] gives the layer to compose with a subscriber of your
//! own. Either way, keep the [`Guard`]: dropping it (or
//! [`Guard::shutdown`]) flushes what is still buffered.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_otel::Exporter; // `idem::otel::Exporter` in the facade
//!
//! // The collector's OTLP/HTTP traces URL (port 4318 by convention).
//! let otel = Exporter::to("http://127.0.0.1:4318/v1/traces")
//!     .service_name("billing-agent")
//!     .install()?;
//! // ... tool calls: each one is a span ...
//! otel.shutdown()?; // flushes the spans still buffered
//! # Ok(())
//! # }
//! ```
//!
//! Composed with a subscriber of your own (add your other layers, such as
//! `tracing-subscriber`'s fmt layer, with more `.with(..)`):
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tracing_subscriber::layer::SubscriberExt as _;
//!
//! let (layer, otel) = idem_otel::Exporter::from_env().build()?;
//! let subscriber = tracing_subscriber::registry().with(layer);
//! tracing::subscriber::set_global_default(subscriber)?;
//! // ...
//! otel.flush()?; // e.g. before a planned exit; dropping `otel` also flushes
//! # Ok(())
//! # }
//! ```
//!
//! Spans are batched and sent from the SDK's own thread by a blocking HTTP
//! client, so a call never waits for the collector; a collector that is
//! down loses spans, never calls.

#![warn(missing_docs)]

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The layer that turns `tracing` spans into OpenTelemetry spans, for a
/// subscriber `S`.
pub type OtelLayer<S> = tracing_opentelemetry::OpenTelemetryLayer<S, Tracer>;

/// Where and how spans are exported: an OTLP/HTTP (protobuf) exporter
/// with a batching span processor.
#[derive(Debug, Clone)]
pub struct Exporter {
    endpoint: Option<String>,
    service_name: Option<String>,
    timeout: Option<Duration>,
}

impl Exporter {
    /// Exports to `endpoint`, the collector's full OTLP/HTTP traces URL,
    /// such as `http://127.0.0.1:4318/v1/traces` (used as given, no path is
    /// appended).
    pub fn to(endpoint: impl Into<String>) -> Exporter {
        Exporter {
            endpoint: Some(endpoint.into()),
            service_name: None,
            timeout: None,
        }
    }

    /// Exports where OpenTelemetry's environment variables say:
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/traces` appended, else
    /// `http://localhost:4318/v1/traces`.
    pub fn from_env() -> Exporter {
        Exporter {
            endpoint: None,
            service_name: None,
            timeout: None,
        }
    }

    /// The `service.name` of the exported spans' resource (without it:
    /// `OTEL_SERVICE_NAME`, else the SDK's `unknown_service`).
    pub fn service_name(mut self, name: impl Into<String>) -> Exporter {
        self.service_name = Some(name.into());
        self
    }

    /// How long one export request may take (the SDK's default: 10 s).
    pub fn timeout(mut self, timeout: Duration) -> Exporter {
        self.timeout = Some(timeout);
        self
    }

    /// The layer to add to a subscriber, and the guard that flushes what it
    /// exports. Takes every span the subscriber lets through; idem's are
    /// at INFO.
    pub fn build<S>(self) -> Result<(OtelLayer<S>, Guard), Error>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary);
        if let Some(endpoint) = self.endpoint {
            exporter = exporter.with_endpoint(endpoint);
        }
        if let Some(timeout) = self.timeout {
            exporter = exporter.with_timeout(timeout);
        }
        let exporter = exporter.build().map_err(Error::Build)?;
        let mut resource = Resource::builder();
        if let Some(name) = self.service_name {
            resource = resource.with_service_name(name);
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        let tracer = provider.tracer("idem");
        let layer = tracing_opentelemetry::layer().with_tracer(tracer);
        Ok((
            layer,
            Guard {
                provider: Some(provider),
            },
        ))
    }

    /// Builds the layer and installs it as the process's global
    /// subscriber (spans at INFO and above). Fails if a global subscriber
    /// is set already: then add [`Exporter::build`]'s layer to yours.
    pub fn install(self) -> Result<Guard, Error> {
        let (layer, guard) = self.build()?;
        let subscriber = tracing_subscriber::registry()
            .with(layer.with_filter(tracing_subscriber::filter::LevelFilter::INFO));
        tracing::subscriber::set_global_default(subscriber).map_err(Error::Install)?;
        Ok(guard)
    }
}

/// Keeps the exporter running; dropping it flushes and stops it (as
/// [`Guard::shutdown`] does, with its error ignored).
#[derive(Debug)]
pub struct Guard {
    /// `None` once shut down.
    provider: Option<SdkTracerProvider>,
}

impl Guard {
    /// Sends every span that has ended and is still buffered, and returns
    /// when the collector has answered (or the export timed out).
    pub fn flush(&self) -> Result<(), Error> {
        match &self.provider {
            Some(provider) => provider.force_flush().map_err(Error::Flush),
            None => Ok(()),
        }
    }

    /// Flushes, then stops the exporter: spans that end later are not
    /// exported.
    pub fn shutdown(mut self) -> Result<(), Error> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), Error> {
        match self.provider.take() {
            Some(provider) => provider.shutdown().map_err(Error::Shutdown),
            None => Ok(()),
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Why export could not be set up, flushed or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The OTLP exporter could not be built (an invalid endpoint, an
    /// environment variable that does not parse, no HTTP client).
    #[error("building the OTLP exporter")]
    Build(#[source] opentelemetry_otlp::ExporterBuildError),
    /// A global subscriber was set already.
    #[error("installing the OpenTelemetry subscriber")]
    Install(#[source] tracing::subscriber::SetGlobalDefaultError),
    /// Buffered spans could not be exported.
    #[error("flushing spans to the OTLP collector")]
    Flush(#[source] opentelemetry_sdk::error::OTelSdkError),
    /// The exporter did not stop cleanly (spans may have been lost).
    #[error("shutting down the OTLP exporter")]
    Shutdown(#[source] opentelemetry_sdk::error::OTelSdkError),
}
