"""Topologies: a lab's network declared as a graph of hosts, switches and routers (graph), and the classic
shapes as templates that make such a graph (templates). Pure: realising a graph is :mod:`vnetbench.lab`'s."""
