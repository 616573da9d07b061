package v1beta1

// Every kind of this package is the hub of its conversions: another
// version converts to and from it, never to another spoke.

// Hub marks Machine as the conversion hub.
func (*Machine) Hub() {}

// Hub marks MachineClass as the conversion hub.
func (*MachineClass) Hub() {}

// Hub marks MachineSet as the conversion hub.
func (*MachineSet) Hub() {}

// Hub marks MachineDeployment as the conversion hub.
func (*MachineDeployment) Hub() {}

// Hub marks MachineHealthCheck as the conversion hub.
func (*MachineHealthCheck) Hub() {}

// Hub marks MachineDisruptionBudget as the conversion hub.
func (*MachineDisruptionBudget) Hub() {}

// Hub marks MachineDrainRule as the conversion hub.
func (*MachineDrainRule) Hub() {}

// Hub marks WorkloadCluster as the conversion hub.
func (*WorkloadCluster) Hub() {}
