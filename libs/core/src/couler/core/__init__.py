"""The open-source Couler SDK's ``couler.core`` module paths, for programs that import them.

Programs written for that SDK import a few classes from where it kept them
(``from couler.core.templates.volume import VolumeMount``,
``from couler.core.templates.toleration import Toleration``,
``from couler.core.constants import WFStatus``); these modules re-export Couler's own
classes under those paths. Nothing else of the SDK's internals is reproduced.
"""
