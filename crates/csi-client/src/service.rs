//! Shared shape of the per-service clients.

/// Defines a service client struct holding the shared caller and per-client call options.
macro_rules! service_client {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $name {
            caller: $crate::call::Caller,
            options: $crate::policy::CallOptions,
        }

        impl $name {
            pub(crate) fn new(caller: $crate::call::Caller) -> Self {
                $name {
                    caller,
                    options: $crate::policy::CallOptions::new(),
                }
            }

            /// A copy of this client whose calls use `options` over the policy table
            /// (for example a shorter deadline for one call).
            #[must_use]
            pub fn with_options(&self, options: $crate::policy::CallOptions) -> Self {
                $name {
                    caller: self.caller.clone(),
                    options,
                }
            }
        }
    };
}
pub(crate) use service_client;

/// Defines a method that sends a raw request and returns the checked raw response.
///
/// `name = rpc` names the method `name` and sends the generated client's `rpc` (for a raw
/// method whose RPC name belongs to the typed call).
macro_rules! raw_rpc {
    ($(#[$doc:meta])* $method:ident = $rpc:ident, $raw:ty, $req:ty => ()) => {
        $(#[$doc])*
        ///
        /// # Errors
        ///
        /// An [`Error`](crate::Error) with the RPC's class: an invalid request is refused
        /// before sending.
        pub async fn $method(&self, request: $req) -> Result<(), $crate::error::Error> {
            self.caller
                .unary(
                    &self.options,
                    request,
                    |ch, req| async move { <$raw>::new(ch).$rpc(req).await },
                    |_| Ok(()),
                )
                .await
        }
    };
    ($(#[$doc:meta])* $method:ident, $raw:ty, $req:ty => ()) => {
        $crate::service::raw_rpc!($(#[$doc])* $method = $method, $raw, $req => ());
    };
    ($(#[$doc:meta])* $method:ident, $raw:ty, $req:ty => $resp:ty) => {
        $(#[$doc])*
        ///
        /// # Errors
        ///
        /// An [`Error`](crate::Error) with the RPC's class: an invalid request is refused
        /// before sending, an answer that breaks the spec is an invalid response.
        pub async fn $method(&self, request: $req) -> Result<$resp, $crate::error::Error> {
            self.caller
                .unary(
                    &self.options,
                    request,
                    |ch, req| async move { <$raw>::new(ch).$method(req).await },
                    Ok,
                )
                .await
        }
    };
}
pub(crate) use raw_rpc;

/// Defines a method that sends a raw request and converts the checked answer into a
/// `csi-structs` value with `$convert` (a failure is an invalid response).
///
/// `name = rpc` names the method `name` and sends the generated client's `rpc`.
macro_rules! typed_rpc {
    ($(#[$doc:meta])* $method:ident, $raw:ty, $req:ty => $out:ty, $convert:expr) => {
        $crate::service::typed_rpc!($(#[$doc])* $method = $method, $raw, $req => $out, $convert);
    };
    ($(#[$doc:meta])* $method:ident = $rpc:ident, $raw:ty, $req:ty => $out:ty, $convert:expr) => {
        $(#[$doc])*
        ///
        /// # Errors
        ///
        /// An [`Error`](crate::Error) with the RPC's class: an invalid request is refused
        /// before sending, an answer that breaks the spec is an invalid response naming the
        /// field.
        pub async fn $method(&self, request: $req) -> Result<$out, $crate::error::Error> {
            self.caller
                .unary(
                    &self.options,
                    request,
                    |ch, req| async move { <$raw>::new(ch).$rpc(req).await },
                    $convert,
                )
                .await
        }
    };
}
pub(crate) use typed_rpc;
