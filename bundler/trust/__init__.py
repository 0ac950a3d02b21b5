"""Image trust: a site's containers-policy.json(5) and registries.d(5), decided as Debian's
skopeo 1.9.3 (containers/image 5.23) decides (docs/trust.md, "Image trust").

``policy`` parses the policy file, ``scopes`` finds the requirements for an image,
``identity`` matches a signature's identity, ``registriesd`` finds the lookaside store,
``lookaside`` fetches the signatures, ``gpg`` verifies them (gpgv, a throwaway keyring),
``simplesign`` reads the signed payload, ``evaluate`` gives the verdict and ``files`` finds
the files the caller's settings name.
"""
