//! Who is calling ([`armada_core::auth`]) and what each may do here.

use crate::*;

pub(crate) fn tenant(who: &Principal) -> Result<&str, ApiError> {
    who.tenant()
}

pub(crate) fn admin(who: &Principal) -> Result<(), ApiError> {
    who.admin()
}

pub(crate) async fn authenticate(svc: &Services, req: &Request) -> Result<Principal, ApiError> {
    let header = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    armada_core::auth::authenticate(svc, header).await
}
