package oauth

import (
	"encoding/json"
	"net/http"
)

// ASMetadata is the authorization server metadata document (RFC 8414) with
// the fields the atproto profile requires.
type ASMetadata struct {
	Issuer                                     string   `json:"issuer"`
	AuthorizationEndpoint                      string   `json:"authorization_endpoint"`
	TokenEndpoint                              string   `json:"token_endpoint"`
	PushedAuthorizationRequestEndpoint         string   `json:"pushed_authorization_request_endpoint"`
	RevocationEndpoint                         string   `json:"revocation_endpoint"`
	RequirePushedAuthorizationRequests         bool     `json:"require_pushed_authorization_requests"`
	ResponseTypesSupported                     []string `json:"response_types_supported"`
	ResponseModesSupported                     []string `json:"response_modes_supported"`
	GrantTypesSupported                        []string `json:"grant_types_supported"`
	CodeChallengeMethodsSupported              []string `json:"code_challenge_methods_supported"`
	TokenEndpointAuthMethodsSupported          []string `json:"token_endpoint_auth_methods_supported"`
	TokenEndpointAuthSigningAlgValuesSupported []string `json:"token_endpoint_auth_signing_alg_values_supported"`
	RevocationEndpointAuthMethodsSupported     []string `json:"revocation_endpoint_auth_methods_supported"`
	DPoPSigningAlgValuesSupported              []string `json:"dpop_signing_alg_values_supported"`
	ScopesSupported                            []string `json:"scopes_supported"`
	SubjectTypesSupported                      []string `json:"subject_types_supported"`
	AuthorizationResponseISSParameterSupported bool     `json:"authorization_response_iss_parameter_supported"`
	RequireRequestURIRegistration              bool     `json:"require_request_uri_registration"`
	ClientIDMetadataDocumentSupported          bool     `json:"client_id_metadata_document_supported"`
	ProtectedResources                         []string `json:"protected_resources"`
}

// Metadata returns the authorization server metadata.
func (s *Server) Metadata() ASMetadata {
	return ASMetadata{
		Issuer:                                     s.cfg.Issuer,
		AuthorizationEndpoint:                      s.endpoint(PathAuthorize),
		TokenEndpoint:                              s.endpoint(PathToken),
		PushedAuthorizationRequestEndpoint:         s.endpoint(PathPAR),
		RevocationEndpoint:                         s.endpoint(PathRevoke),
		RequirePushedAuthorizationRequests:         true,
		ResponseTypesSupported:                     []string{"code"},
		ResponseModesSupported:                     []string{"query", "fragment"},
		GrantTypesSupported:                        []string{"authorization_code", "refresh_token"},
		CodeChallengeMethodsSupported:              []string{"S256"},
		TokenEndpointAuthMethodsSupported:          []string{"none", "private_key_jwt"},
		TokenEndpointAuthSigningAlgValuesSupported: []string{"ES256"},
		RevocationEndpointAuthMethodsSupported:     []string{"none", "private_key_jwt"},
		DPoPSigningAlgValuesSupported:              []string{"ES256"},
		ScopesSupported: []string{
			ScopeAtproto, ScopeGeneric, ScopeChat, ScopeEmail,
			"repo:*", "blob:*/*", "account:email", "account:repo?action=manage", "identity:handle", "identity:*",
		},
		SubjectTypesSupported:                      []string{"public"},
		AuthorizationResponseISSParameterSupported: true,
		RequireRequestURIRegistration:              true,
		ClientIDMetadataDocumentSupported:          true,
		ProtectedResources:                         []string{s.cfg.Issuer},
	}
}

// ResourceMetadata is the protected resource metadata document.
type ResourceMetadata struct {
	Resource               string   `json:"resource"`
	AuthorizationServers   []string `json:"authorization_servers"`
	ScopesSupported        []string `json:"scopes_supported"`
	BearerMethodsSupported []string `json:"bearer_methods_supported"`
	ResourceDocumentation  string   `json:"resource_documentation,omitempty"`
}

func (s *Server) handleASMetadata(w http.ResponseWriter, r *http.Request) {
	writeMetadata(w, s.Metadata())
}

func (s *Server) handleRSMetadata(w http.ResponseWriter, r *http.Request) {
	writeMetadata(w, ResourceMetadata{
		Resource:               s.cfg.Issuer,
		AuthorizationServers:   []string{s.cfg.Issuer},
		ScopesSupported:        []string{},
		BearerMethodsSupported: []string{"header"},
		ResourceDocumentation:  "https://atproto.com",
	})
}

// writeMetadata serves a public document that clients may cache briefly.
func writeMetadata(w http.ResponseWriter, v any) {
	w.Header().Set("Cache-Control", "public, max-age=300")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_ = json.NewEncoder(w).Encode(v)
}
