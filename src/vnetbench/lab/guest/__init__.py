"""QEMU guests for the `vm` environment.

- :mod:`.initramfs`: the guest's root file system, built from this machine's
  packages (busybox-static, the workload tools and their libraries, dropbear,
  the NIC drivers) and cached by a hash of its inputs; the kernel to boot.
- :mod:`.qemu`: one guest's lifecycle: start QEMU in a host namespace (KVM,
  else TCG), wait for SSH, run commands, sync its clock, power it off.

:mod:`vnetbench.lab.environments.vm` builds the host side (bridge, TAPs) and
gives the lab hosts with :class:`vnetbench.lab.nodes.NamespaceNode`'s interface.
"""
