"""Filters of the netprobe_agent role: the address a fleet host is reached at (for the
agents' --allow list), and whether an --allow entry is an address or a network."""

import ipaddress


def _is_network(value):
    try:
        ipaddress.ip_network(str(value), strict=False)
    except ValueError:
        return False
    return True


def address_of(host):
    """A host's address from its hostvars: ansible_host when it is an address, else the
    default IPv4 address its facts name, else whatever ansible_host or its name says (which
    the role's assert then refuses if it is not an address)."""
    given = host.get("ansible_host")
    if given and _is_network(given):
        return str(given)
    facts = host.get("ansible_facts") or {}
    default = facts.get("default_ipv4") or host.get("ansible_default_ipv4") or {}
    return default.get("address") or given or host.get("inventory_hostname")


class FilterModule:
    """Ansible's entry point for filter plugins."""

    def filters(self):
        return {"netprobe_address_of": address_of, "netprobe_is_network": _is_network}
